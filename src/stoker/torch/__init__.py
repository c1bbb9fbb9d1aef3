"""stoker.torch"""
