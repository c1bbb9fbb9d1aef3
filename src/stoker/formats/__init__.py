"""Layer 1: on-disk formats. One folder per format, each with its reader, its writer and a
README; the contracts in ``base``; the registry (``stoker.formats.open``) in ``registry``."""

from stoker.formats.base import Reader, ReadSample, ShardWriter
from stoker.formats.registry import FORMATS, Format, format_of, open_reader

#: ``stoker.formats.open(path, *, format=None, **options) -> Reader``
open = open_reader  # noqa: A001 - the registry's front door, named as the issue asks

__all__ = [
    "FORMATS",
    "Format",
    "ReadSample",
    "Reader",
    "ShardWriter",
    "format_of",
    "open",
    "open_reader",
]
