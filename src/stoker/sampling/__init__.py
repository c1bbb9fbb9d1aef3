"""stoker.sampling"""
