"""The ``NAME.stoker.json`` of a stoker-written WebDataset set (``"format": "stoker-wds"``).

Version 1::

    {
      "format": "stoker-wds", "version": 1, "records": 1200,
      "shards": [
        {"tar": "train-00000.tar", "records": 600, "tar_bytes": 2457600,
         "sha256": "<64 hex>",              # optional (written with checksums=True)
         "crc32c": "train-00000.crc32c"},   # optional: each sample's CRC32C (the writer's)
        ...
      ],                                     # paths relative to the manifest's folder
      "classes": {...}, "schema": {...}, "pack": {...}, "rejects": {...}
    }

The shared parts are checked by :mod:`stoker.formats.manifest`; this module checks the shard
entries and names the field at fault.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stoker.formats.manifest import check_shards, read_json, write_json

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "load_manifest",
    "shard_tar",
    "validate_manifest",
    "write_manifest",
]

FORMAT_NAME = "stoker-wds"
FORMAT_VERSION = 1


#: the fields of a ``shards[]`` entry (see :func:`stoker.formats.manifest.check_shards`)
_ENTRY = {
    "tar": "file",
    "records": "count",
    "tar_bytes": "count",
    "sha256": "sha256?",
    "crc32c": "file?",
}


def validate_manifest(m: Any, path: str = "<manifest>") -> dict:
    """Check a stoker-wds manifest; returns it. :class:`ManifestError` names the field."""
    return check_shards(path, m, FORMAT_NAME, FORMAT_VERSION, _ENTRY)


def load_manifest(path: str | os.PathLike[str]) -> dict:
    """Read (size-capped, JSON only) and validate a manifest."""
    return validate_manifest(read_json(path), os.fspath(path))


def write_manifest(path: str | os.PathLike[str], manifest: Mapping[str, Any]) -> None:
    """Validate and write atomically."""
    write_json(path, validate_manifest(dict(manifest), os.fspath(path)))


def shard_tar(manifest_path: str, shard: Mapping[str, Any]) -> str:
    """The tar path of a ``shards[]`` entry, resolved against the manifest's folder."""
    return os.path.join(os.path.dirname(os.path.abspath(manifest_path)), shard["tar"])
