"""The cache directory: derived files (indexes, key lists, label tables) kept away from the
data, so read-only and shared data sets work and nothing is ever required beside them.

``cache_dir()`` is ``$STOKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/stoker``, else
``~/.cache/stoker``; it is created with mode 0700 (cached files are the user's own).
``cache_file(kind, path, suffix)`` names the cache entry of one data file: a hash of its real
path, size, modification time and inode, so a changed, replaced or moved file gets a new entry
and a stale one is never read. Entries are written to a temporary name and renamed
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


def file_identity(path: str | os.PathLike[str]) -> tuple[str, int, int, int]:
    """(real path, size, mtime_ns, inode) of ``path``: what a cache entry is keyed by."""
    real = os.path.realpath(os.fspath(path))
    st = os.stat(real)
    return real, int(st.st_size), int(st.st_mtime_ns), int(st.st_ino)


def cache_file(kind: str, path: str | os.PathLike[str], suffix: str = "") -> str | None:
    """The cache entry for ``kind`` (``"tfrecord-index"``, ...) of data file ``path``, its
    folder created (0700); ``None`` when the cache directory cannot be made."""
    real, size, mtime, ino = file_identity(path)
    digest = hashlib.sha256(f"{real}\0{size}\0{mtime}\0{ino}".encode()).hexdigest()[:32]
    folder = os.path.join(cache_dir(), kind)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return os.path.join(folder, digest + suffix)
