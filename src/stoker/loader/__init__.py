"""stoker.loader"""
