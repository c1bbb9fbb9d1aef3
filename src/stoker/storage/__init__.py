"""Where bytes live: local paths and fsspec URLs (``s3://``, ``gs://``, ``az://``, ``http(s)://``).

The one room that imports fsspec (lazily: ``import stoker`` never does). It holds:

- ``urls``: which URLs are accepted, how a manifest's relative names become URLs under it
  (refusing another scheme, bucket or host, ``..``, ``file://`` and metadata addresses), and
  :func:`redact`, which takes credentials out of any text shown to a user;
- ``remote``: :class:`Remote`, one dataset root's storage (fsspec filesystem, credentials from
  the standard places or ``storage_options``), with bounded retries, byte-range resume and
  exact-size checks on every download, and uploads;
- ``cache``: :class:`ShardCache`, the node-wide cache of whole shards (byte budget, file locks,
  pins, eviction of what no reader holds, atomic downloads checked by size and CRC32C);
- ``ahead``: :class:`AheadFetcher`, a thread that downloads shards ahead of the order they will
  be read in.

See ``docs/remote.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> module: loaded on first use, so that reading local files never imports the storage
# clients (urllib, ipaddress, sockets; fsspec only when a URL is read)
_LAZY = {
    "AheadFetcher": "ahead",
    "Item": "ahead",
    "Pin": "cache",
    "Remote": "remote",
    "RetryPolicy": "retry",
    "SCHEMES": "urls",
    "ShardCache": "cache",
    "check_url": "urls",
    "close_filesystems": "remote",
    "is_url": "urls",
    "join_under": "urls",
    "redact": "urls",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stoker.storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"stoker.storage.{module}"), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover
    from stoker.storage.ahead import AheadFetcher, Item
    from stoker.storage.cache import Pin, ShardCache
    from stoker.storage.remote import Remote, close_filesystems
    from stoker.storage.retry import RetryPolicy
    from stoker.storage.urls import SCHEMES, check_url, is_url, join_under, redact
