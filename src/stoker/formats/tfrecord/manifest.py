"""The ``NAME.stoker.json`` of a stoker-written TFRecord set (format ``"stoker-tfrecord"``)::

    {
      "format": "stoker-tfrecord", "version": 1,
      "records": 1200,
      "shards": [{"path": "train-00000.tfrecord", "records": 600, "bytes": 73400320}, ...],
      "classes": {"cat": 0, "dog": 1},
      "schema": {...},                       # Schema.to_json(): the fields of one sample
      "features": {"image": "image/encoded", "label": "image/class/label",
                   "boxes": "image/object/bbox", "classes": "image/object/class/label"},
      "key_feature": "stoker/key",
      "pack": {...}, "rejects": {...}
    }

``features`` maps each field to the Example feature holding it (a boxes field to the prefix of
its four ``/xmin`` ... features). Shard paths are relative to the manifest's folder; the
checks shared by every format (size cap, relative paths, counts, classes, schema) are
:mod:`stoker.formats.manifest`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stoker._core.schema import Schema
from stoker.formats.manifest import (
    check_shards,
    fail,
    manifest_schema,
    read_json,
)

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "load_manifest", "shard_files", "validate_manifest"]

FORMAT_NAME = "stoker-tfrecord"
FORMAT_VERSION = 1


#: the fields of a ``shards[]`` entry (see :func:`stoker.formats.manifest.check_shards`)
_ENTRY = {"path": "file", "records": "count", "bytes": "count"}


def validate_manifest(m: Any, path: str = "<manifest>") -> dict:
    """Check a TFRecord set's manifest; returns it. ``ManifestError`` names the entry."""
    check_shards(path, m, FORMAT_NAME, FORMAT_VERSION, _ENTRY)
    schema = manifest_schema(m, path) or Schema.classification()
    features = m.get("features")
    if not isinstance(features, dict) or any(
        not isinstance(v, str) or not v for v in features.values()
    ):
        raise fail(path, "features must be an object {field: feature name}")
    missing = [n for n, f in schema.items() if f.kind != "size" and n not in features]
    if missing:
        raise fail(path, f"features names no feature for the fields {missing}")
    if not isinstance(m.get("key_feature", "stoker/key"), str):
        raise fail(path, "key_feature must be a feature name")
    return m


def load_manifest(path: str | os.PathLike[str]) -> dict:
    """Read (size-capped, JSON only) and validate a manifest."""
    p = os.fspath(path)
    return validate_manifest(read_json(p), p)


def shard_files(manifest_path: str, m: Mapping[str, Any]) -> list[tuple[str, int, int]]:
    """``(file, records, bytes)`` of each shard, paths resolved against the manifest's folder."""
    base = os.path.dirname(os.path.abspath(manifest_path))
    return [(os.path.join(base, s["path"]), s["records"], s["bytes"]) for s in m["shards"]]
