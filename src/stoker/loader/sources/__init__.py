"""Where samples come from: any format behind the seam, an image folder, or arrays in shared
memory.

The contract is :class:`~stoker.loader.sources.base.Source`; each kind of source lives in a
module of its own, and :func:`as_source` picks one for what ``Loader`` is given. Every format
goes through :class:`FormatSource` over the registry's reader (``stoker.formats.open``);
:class:`RecordSource` is that for RecordIO.
"""

from __future__ import annotations

import os
from typing import Any

from stoker.formats.remote import RemoteOptions, local_path, remote_url
from stoker.loader.sources.arrays import ArraySource
from stoker.loader.sources.base import Source
from stoker.loader.sources.folder import FolderSource
from stoker.loader.sources.formats import FormatSource
from stoker.loader.sources.records import RecordSource

__all__ = ["ArraySource", "FolderSource", "FormatSource", "RecordSource", "Source", "as_source"]


def _format_of(path: str) -> Any:
    """The registry's format of ``path``; for a folder ``None`` when no format claims it (then
    it is an image folder; a format whose sniff cannot be loaded here claims no folder)."""
    from stoker.formats import format_of

    if not os.path.isdir(path):
        return format_of(path)  # a bad manifest or an unknown file type is an error here
    try:
        return format_of(path)
    except (ValueError, ImportError, AttributeError):
        return None


def as_source(source: Any, *, remote: RemoteOptions | None = None) -> tuple[Source, bool]:
    """``(Source, owned)`` for what ``Loader`` accepts: a path, an ``(x, y)`` tuple, a Source.

    A path is a set in any registered format (a manifest, a file by its extension, a folder a
    format recognises, such as an LMDB database), else an image folder. A URL (``s3://``,
    ``gs://``, ``az://``, ``http(s)://``) names a set's manifest in object storage, read
    through the shard cache as ``remote`` says; ``file://`` is a local path. ``owned`` is True
    when the source was made here (the loader then closes it).
    """
    if isinstance(source, Source):
        return source, False
    if isinstance(source, tuple):
        if len(source) != 2:
            raise ValueError(f"an array source is a tuple (x, y), got {len(source)} items")
        return ArraySource(*source), True
    if isinstance(source, (str, os.PathLike)):
        path = local_path(os.fspath(source))
        if remote_url(path) is not None:
            from stoker.formats import format_of

            fmt = format_of(path, remote=remote)
            return FormatSource(path, format=fmt.name, remote=remote or RemoteOptions()), True
        if not os.path.exists(path):
            raise FileNotFoundError(f"source {path} does not exist")
        fmt = _format_of(path)
        if fmt is None:
            return FolderSource(path), True
        return FormatSource(path, format=fmt.name), True
    raise TypeError(
        "source must be a path (a data set in any format, a .stoker.json manifest, an image "
        f"folder), a tuple (x, y) of arrays or a stoker Source, got {type(source).__name__}"
    )
