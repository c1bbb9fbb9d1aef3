"""A RecordIO set's ``NAME.stoker.json``: the one manifest schema of every format
(:mod:`stoker.formats.manifest`), with ``kind`` ``"recordio"``. A shard entry::

    {"files": {"data": "train-00000.rec", "index": "train-00000.idx",
               "crc": "train-00000.crc32c"},     # crc: optional, one CRC32C per record
     "records": 600, "bytes": 2457600,           # bytes of the .rec
     "checksums": {"index.sha256": "<64 hex>",   # always: the .idx it was written with
                   "data.crc32c": 3735928559}}   # optional: CRC32C of the whole .rec

No ``schema`` key: the set is an image and its IRHeader label(s) (``Schema.classification``),
as every set packed before fields existed. With one, records of a schema with stored fields
end in a field trailer (``stoker.formats.fields``); the manifest is the only authority on that.

What is RecordIO's own here: :func:`shard_entry` (a :class:`ShardInfo`'s entry) and
:func:`shard_paths`; the rest keeps the names earlier versions exported, over the one schema.
Version-1 manifests (``"format": "stoker-recordio"``) still open, translated on load.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from stoker.formats.manifest import (
    MANIFEST_SUFFIX,
    MAX_MANIFEST_BYTES,
    load,
    make,
    manifest_schema,
    shard_file,
    validate,
    write_json,
)
from stoker.formats.manifest_json import class_names
from stoker.formats.shards import ShardEntry

__all__ = [
    "KIND",
    "MANIFEST_SUFFIX",
    "MAX_MANIFEST_BYTES",
    "class_names",
    "load_manifest",
    "make_manifest",
    "manifest_schema",
    "shard_entry",
    "shard_paths",
    "validate_manifest",
    "write_manifest",
]

#: the manifest's ``kind`` (the registry name: FORMAT.name)
KIND = "recordio"


def validate_manifest(m: Any, path: str = "<manifest>") -> dict:
    """Check a RecordIO set's manifest (version 1 or 2); returns it as version 2. Raises
    :class:`ManifestError` naming the field."""
    return validate(m, path, KIND)


def load_manifest(path: str | os.PathLike[str], *, max_bytes: int = MAX_MANIFEST_BYTES) -> dict:
    """Read and check a RecordIO set's manifest; its shards are
    :class:`~stoker.formats.shards.ShardEntry` objects."""
    return load(path, kind=KIND, max_bytes=max_bytes)


def write_manifest(path: str | os.PathLike[str], manifest: Mapping[str, Any]) -> None:
    """Check and write ``manifest`` atomically (``.partial`` + fsync + rename)."""
    write_json(path, validate_manifest(dict(manifest), os.fspath(path)))


def shard_paths(
    manifest_path: str | os.PathLike[str], shard: ShardEntry
) -> tuple[str, str, str | None]:
    """The ``.rec``, ``.idx`` and ``.crc32c`` (or ``None``) paths of a shard entry, resolved
    against the folder of ``manifest_path``."""
    rec, idx, crc = (shard_file(manifest_path, shard, r) for r in ("data", "index", "crc"))
    assert rec is not None and idx is not None  # required roles
    return rec, idx, crc


def shard_entry(info: Any, manifest_path: str | os.PathLike[str]) -> dict:
    """The ``shards[]`` entry for a committed :class:`ShardInfo`, with paths relative to
    the folder of ``manifest_path``."""
    base = os.path.dirname(os.path.abspath(os.fspath(manifest_path)))

    def rel(p: str) -> str:
        return os.path.relpath(os.path.abspath(p), base)

    files = {"data": rel(info.rec), "index": rel(info.idx)}
    if info.crc32c is not None:
        files["crc"] = rel(info.crc32c)
    checksums: dict[str, str | int] = {"index.sha256": info.idx_sha256}
    if info.rec_crc32c is not None:
        checksums["data.crc32c"] = int(info.rec_crc32c)
    entry = ShardEntry(int(info.records), files, int(info.rec_bytes), checksums)
    return entry.to_json()


def make_manifest(
    shards: list[dict],
    *,
    classes: Mapping[str, int] | None = None,
    pack: Mapping[str, Any] | None = None,
    rejects: Mapping[str, Any] | None = None,
    schema: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict:
    """A checked manifest of a RecordIO set from its :func:`shard_entry` entries."""
    return make(
        KIND, shards, classes=classes, pack=pack, rejects=rejects, schema=schema, options=options
    )
