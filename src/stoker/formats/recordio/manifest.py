"""The ``NAME.stoker.json`` side-car: JSON only, size-capped, schema-checked, never unpickled.

Schema (version 1)::

    {
      "format": "stoker-recordio",
      "version": 1,
      "records": 1200,                       # sum over shards
      "shards": [
        {"rec": "train-00000.rec", "idx": "train-00000.idx", "records": 600,
         "rec_bytes": 2457600, "idx_sha256": "<64 hex>", "crc32c": "train-00000.crc32c",
         "rec_crc32c": 3735928559},          # optional: CRC32C of the whole .rec
        ...
      ],                                      # paths relative to the manifest's folder
      "classes": {"cat": 0, "dog": 1},        # ids 0..C-1
      "pack": {...},                          # settings of the run that wrote it (free-form)
      "rejects": {...},                       # reject summary (free-form)
      "schema": {"version": 1, "fields": [...]}  # optional: Schema.to_json of one sample
    }

No ``schema`` key: the set is an image and its IRHeader label(s) (``Schema.classification``),
as every set packed before fields existed. With one, records of a schema with stored fields
end in a field trailer (``stoker.formats.fields``); the manifest is the only authority on that.

Other top-level keys are kept and ignored (room for later versions to add fields).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stoker.formats.manifest import (
    MANIFEST_SUFFIX,
    MAX_MANIFEST_BYTES,
    check_shards,
    class_names,
    manifest_schema,
    read_json,
    write_json,
)

__all__ = [
    "FORMAT_NAME",
    "manifest_schema",
    "FORMAT_VERSION",
    "MANIFEST_SUFFIX",
    "MAX_MANIFEST_BYTES",
    "class_names",
    "load_manifest",
    "make_manifest",
    "shard_entry",
    "shard_paths",
    "validate_manifest",
    "write_manifest",
]

FORMAT_NAME = "stoker-recordio"
FORMAT_VERSION = 1


#: the fields of a ``shards[]`` entry (see :func:`stoker.formats.manifest.check_shards`)
_ENTRY = {
    "rec": "file",
    "idx": "file",
    "records": "count",
    "rec_bytes": "count",
    "idx_sha256": "sha256",
    "crc32c": "file?",
    "rec_crc32c": "u32?",
}


def validate_manifest(m: Any, path: str = "<manifest>") -> dict:
    """Check the schema; returns ``m``. Raises :class:`ManifestError` naming the field."""
    return check_shards(path, m, FORMAT_NAME, FORMAT_VERSION, _ENTRY)


def load_manifest(path: str | os.PathLike[str], *, max_bytes: int = MAX_MANIFEST_BYTES) -> dict:
    """Read and validate a manifest (size-capped, UTF-8 JSON, never unpickled)."""
    return validate_manifest(read_json(path, max_bytes=max_bytes), os.fspath(path))


def write_manifest(path: str | os.PathLike[str], manifest: Mapping[str, Any]) -> None:
    """Validate and write ``manifest`` atomically (``.partial`` + fsync + rename)."""
    write_json(path, validate_manifest(dict(manifest), os.fspath(path)))


def shard_paths(
    manifest_path: str | os.PathLike[str], shard: Mapping[str, Any]
) -> tuple[str, str, str | None]:
    """The ``.rec``, ``.idx`` and ``.crc32c`` (or ``None``) paths of a ``shards[]`` entry,
    resolved against the folder of ``manifest_path``."""
    base = os.path.dirname(os.path.abspath(os.fspath(manifest_path)))
    crc = shard.get("crc32c")
    return (
        os.path.join(base, shard["rec"]),
        os.path.join(base, shard["idx"]),
        os.path.join(base, crc) if crc else None,
    )


def shard_entry(info: Any, manifest_path: str | os.PathLike[str]) -> dict:
    """The ``shards[]`` entry for a committed :class:`ShardInfo`, with paths relative to
    the folder of ``manifest_path``."""
    base = os.path.dirname(os.path.abspath(os.fspath(manifest_path)))

    def rel(p: str | None) -> str | None:
        return None if p is None else os.path.relpath(os.path.abspath(p), base)

    return {
        "rec": rel(info.rec),
        "idx": rel(info.idx),
        "records": int(info.records),
        "rec_bytes": int(info.rec_bytes),
        "idx_sha256": info.idx_sha256,
        "crc32c": rel(info.crc32c),
        **({} if info.rec_crc32c is None else {"rec_crc32c": int(info.rec_crc32c)}),
    }


def make_manifest(
    shards: list[dict],
    *,
    classes: Mapping[str, int] | None = None,
    pack: Mapping[str, Any] | None = None,
    rejects: Mapping[str, Any] | None = None,
    **extra: Any,
) -> dict:
    """A version-1 manifest dict (validated)."""
    m = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "records": sum(int(s["records"]) for s in shards),
        "shards": list(shards),
        "classes": dict(classes or {}),
        "pack": dict(pack or {}),
        "rejects": dict(rejects or {}),
        **extra,
    }
    return validate_manifest(m)
