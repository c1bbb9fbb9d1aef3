"""Where a ``NAME.rec``'s side files live: ``NAME.idx``, ``NAME.crc32c`` and ``NAME.stoker.json``.

The caches derived from them live in the cache directory, never beside the data:
``index.cache_path`` and ``labelcache.label_cache_path`` name their entries.
"""

from __future__ import annotations

import os

from stoker.formats.recordio.manifest import MANIFEST_SUFFIX

__all__ = ["default_crc_path", "default_idx_path", "manifest_path_for"]


def _stem(rec_path: str | os.PathLike[str]) -> str:
    p = os.fspath(rec_path)
    return p[:-4] if p.endswith(".rec") else p


def default_idx_path(rec_path: str | os.PathLike[str]) -> str:
    """``NAME.idx`` beside ``NAME.rec``."""
    return _stem(rec_path) + ".idx"


def default_crc_path(rec_path: str | os.PathLike[str]) -> str:
    """``NAME.crc32c`` beside ``NAME.rec``."""
    return _stem(rec_path) + ".crc32c"


def manifest_path_for(rec_path: str | os.PathLike[str]) -> str:
    """``NAME.stoker.json`` beside ``NAME.rec``."""
    return _stem(rec_path) + MANIFEST_SUFFIX
