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
import re
from collections.abc import Mapping
from typing import Any

from stoker.formats.manifest import (
    check_classes,
    check_count,
    check_distinct,
    check_head,
    check_rel_path,
    check_total,
    fail,
    read_json,
    write_json,
)

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
_SHA_RE = re.compile(r"[0-9a-f]{64}\Z")


def validate_manifest(m: Any, path: str = "<manifest>") -> dict:
    """Check a stoker-wds manifest; returns it. :class:`ManifestError` names the field."""
    shards = check_head(path, m, FORMAT_NAME, FORMAT_VERSION)
    total = 0
    for j, s in enumerate(shards):
        w = f"shards[{j}]"
        check_rel_path(path, f"{w}.tar", s.get("tar"))
        total += check_count(path, f"{w}.records", s.get("records"))
        check_count(path, f"{w}.tar_bytes", s.get("tar_bytes"))
        sha = s.get("sha256")
        if sha is not None and (not isinstance(sha, str) or not _SHA_RE.match(sha)):
            raise fail(path, f"{w}.sha256 must be 64 lowercase hex digits")
        if s.get("crc32c") is not None:
            check_rel_path(path, f"{w}.crc32c", s.get("crc32c"))
    check_distinct(path, shards, ("tar", "crc32c"))
    check_total(path, m, total)
    check_classes(path, m)
    return m


def load_manifest(path: str | os.PathLike[str]) -> dict:
    """Read (size-capped, JSON only) and validate a manifest."""
    return validate_manifest(read_json(path), os.fspath(path))


def write_manifest(path: str | os.PathLike[str], manifest: Mapping[str, Any]) -> None:
    """Validate and write atomically."""
    write_json(path, validate_manifest(dict(manifest), os.fspath(path)))


def shard_tar(manifest_path: str, shard: Mapping[str, Any]) -> str:
    """The tar path of a ``shards[]`` entry, resolved against the manifest's folder."""
    return os.path.join(os.path.dirname(os.path.abspath(manifest_path)), shard["tar"])
