"""stoker.pack"""
