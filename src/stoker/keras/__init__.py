"""stoker.keras"""
