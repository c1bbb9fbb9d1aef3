"""What ``Loader`` is given, as the reader it reads: a set in any registered format (through
``stoker.formats.open``), an image folder, arrays, or a :class:`~stoker.formats.Reader`."""

from __future__ import annotations

import os
from typing import Any

from stoker.formats import Reader
from stoker.formats.registry import pattern_refusal
from stoker.formats.remote import RemoteOptions, local_path, remote_url
from stoker.loader.sources.arrays import ArraySource
from stoker.loader.sources.folder import FolderSource

__all__ = ["as_source", "empty_set_error", "set_format"]


def empty_set_error(path: str) -> Exception:
    """The error for a set without a single sample: nothing to load (a manifest's is a
    :class:`ManifestError`, a data file's a :class:`CorruptRecordError`)."""
    from stoker._core.errors import CorruptRecordError, ManifestError
    from stoker.formats.manifest import MANIFEST_SUFFIX

    reason = "0 records: the set is empty, there is nothing to load"
    if path.endswith(MANIFEST_SUFFIX):
        return ManifestError(f"{path}: {reason}")
    return CorruptRecordError(path, None, reason)


def set_format(path: str) -> Any:
    """The registry's format of ``path``; for a folder ``None`` when no format claims it (then
    it is an image folder; a format whose sniff cannot be loaded here claims no folder)."""
    from stoker.formats import format_of

    if not os.path.isdir(path):
        return format_of(path)  # a bad manifest or an unknown file type is an error here
    try:
        return format_of(path)
    except (ValueError, ImportError, AttributeError):
        return None


def _opened(path: str, name: str, **options: Any) -> Reader:
    """The registry's reader of ``path`` in format ``name``; an empty set is an error here:
    there is nothing to load."""
    from stoker.formats import open_reader

    reader = open_reader(path, format=name, **options)
    if len(reader) == 0:
        reader.close()
        raise empty_set_error(reader.path or path)
    return reader


def as_source(source: Any, *, remote: RemoteOptions | None = None) -> tuple[Reader, bool]:
    """``(Reader, owned)`` for what ``Loader`` accepts: a path, an ``(x, y)`` tuple, a Reader.

    A path is a set in any registered format (a manifest, a file by its extension, a folder a
    format recognises, such as an LMDB database), else an image folder. A URL (``s3://``,
    ``gs://``, ``az://``, ``http(s)://``) names a set's manifest in object storage, read
    through the shard cache as ``remote`` says; ``file://`` is a local path. ``owned`` is True
    when the reader was opened here (the loader then closes it).
    """
    if isinstance(source, Reader):
        return source, False
    if isinstance(source, tuple):
        if len(source) != 2:
            raise ValueError(f"an array source is a tuple (x, y), got {len(source)} items")
        return ArraySource(*source), True
    if isinstance(source, (str, os.PathLike)):
        path = local_path(os.fspath(source))
        if not os.path.exists(path) and (why := pattern_refusal(path)) is not None:
            raise ValueError(why)
        if remote_url(path) is not None:
            from stoker.formats import format_of

            fmt = format_of(path, remote=remote)
            return _opened(path, fmt.name, remote=remote or RemoteOptions()), True
        if not os.path.exists(path):
            raise FileNotFoundError(f"source {path} does not exist")
        fmt = set_format(path)
        if fmt is None:
            return FolderSource(path), True
        return _opened(path, fmt.name, remote=remote), True
    raise TypeError(
        "source must be a path (a data set in any format, a .stoker.json manifest, an image "
        "folder), a tuple (x, y) of arrays or a stoker.formats.Reader, got "
        f"{type(source).__name__}"
    )
