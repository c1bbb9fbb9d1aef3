"""stoker.codecs"""
