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

from stoker.storage.ahead import AheadFetcher, Item
from stoker.storage.cache import Pin, ShardCache
from stoker.storage.remote import Remote, close_filesystems
from stoker.storage.retry import RetryPolicy
from stoker.storage.urls import SCHEMES, check_url, is_url, join_under, redact

__all__ = [
    "AheadFetcher",
    "Item",
    "Pin",
    "Remote",
    "RetryPolicy",
    "SCHEMES",
    "ShardCache",
    "check_url",
    "close_filesystems",
    "is_url",
    "join_under",
    "redact",
]
