"""Where samples come from: packed records, an image folder, or arrays in shared memory.

The contract is :class:`~stoker.loader.sources.base.Source`; each kind of source lives in a
module of its own, and :func:`as_source` picks one for what ``Loader`` is given.
"""

from __future__ import annotations

import os
from typing import Any

from stoker.loader.sources.arrays import ArraySource
from stoker.loader.sources.base import Source
from stoker.loader.sources.folder import FolderSource
from stoker.loader.sources.records import RecordSource

__all__ = ["ArraySource", "FolderSource", "RecordSource", "Source", "as_source"]


def as_source(source: Any) -> tuple[Source, bool]:
    """``(Source, owned)`` for what ``Loader`` accepts: a path, an ``(x, y)`` tuple, a Source.

    ``owned`` is True when the source was made here (the loader then closes it).
    """
    if isinstance(source, Source):
        return source, False
    if isinstance(source, tuple):
        if len(source) != 2:
            raise ValueError(f"an array source is a tuple (x, y), got {len(source)} items")
        return ArraySource(*source), True
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path):
            return FolderSource(path), True
        if path.endswith((".rec", ".idx", ".json")):
            return RecordSource(path), True
        if not os.path.exists(path):
            raise FileNotFoundError(f"source {path} does not exist")
        raise ValueError(
            f"source {path}: expected a .rec, a .stoker.json manifest or an image folder"
        )
    raise TypeError(
        "source must be a path (.rec, .stoker.json, image folder), a tuple (x, y) of arrays "
        f"or a stoker Source, got {type(source).__name__}"
    )
