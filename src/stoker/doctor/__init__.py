"""stoker.doctor"""
