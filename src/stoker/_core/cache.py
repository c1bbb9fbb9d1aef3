"""The cache directory: derived files (indexes, key lists, label tables) kept away from the
data, so read-only and shared data sets work and nothing is ever required beside them.

``cache_dir()`` is ``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else
``~/.cache/stoker``; it is created with mode 0700 (cached files are the user's own).
``cache_file(kind, path, suffix)`` names the cache entry of one data file: a hash of its
absolute path, device, inode, size and modification time (one ``stat`` and no ``realpath``:
this runs at every shard open, and a set of 100,000 shards opens them over and over), so a
changed, replaced or other file gets a new entry and a stale one is never read, even where a
deleted file's inode comes back for a new one of the same size within one timestamp tick. Entries are written to a temporary name and renamed
(``stoker._core.atomic``); an unwritable cache directory means running without a cache, never
an error.
"""

from __future__ import annotations

import hashlib
import os

__all__ = ["cache_dir", "cache_file", "file_identity"]


def cache_dir() -> str:
    """The cache root (see the module docstring); created on first use."""
    root = os.environ.get("STOKER_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "stoker")
    return root


def file_identity(path: str | os.PathLike[str]) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime_ns) of ``path``: what a cache entry is keyed by."""
    st = os.stat(os.fspath(path))
    return int(st.st_dev), int(st.st_ino), int(st.st_size), int(st.st_mtime_ns)


_MADE: set[str] = set()  # cache folders this process has made (or found) already


def cache_file(
    kind: str, path: str | os.PathLike[str], suffix: str = "", *, identity: str | None = None
) -> str | None:
    """The cache entry for ``kind`` (``"tfrecord-index"``, ...) of data file ``path``, its
    folder created (0700); ``None`` when the cache directory cannot be made. ``identity``
    names the bytes instead of ``path``'s stat (a shard of a set in object storage: the
    shard cache's key of its copy, made of its URL, size and CRC), so every process of the
    node finds the entry without the file."""
    if identity is not None:
        digest = hashlib.sha256(f"object\0{identity}".encode()).hexdigest()
    else:
        dev, ino, size, mtime = file_identity(path)
        where = os.path.abspath(os.fspath(path))
        digest = hashlib.sha256(f"{where}\0{dev}\0{ino}\0{size}\0{mtime}".encode()).hexdigest()
    digest = digest[:32]
    folder = os.path.join(cache_dir(), kind)
    if folder not in _MADE:
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError:
            return None
        _MADE.add(folder)
    return os.path.join(folder, digest + suffix)
