"""stoker.train"""
