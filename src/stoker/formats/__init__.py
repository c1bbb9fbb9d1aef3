"""Layer 1: on-disk formats. One folder per format, each with reader.py, writer.py and README.md."""

from stoker.formats.base import Reader

__all__ = ["Reader"]
