"""The ``NAME.stoker.json`` side-car: JSON only, size-capped, schema-checked, never unpickled.

Schema (version 1)::

    {
      "format": "stoker-recordio",
      "version": 1,
      "records": 1200,                       # sum over shards
      "shards": [
        {"rec": "train-00000.rec", "idx": "train-00000.idx", "records": 600,
         "rec_bytes": 2457600, "idx_sha256": "<64 hex>", "crc32c": "train-00000.crc32c"},
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

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from stoker._core.atomic import write_bytes_atomic
from stoker._core.errors import ManifestError, SpecError
from stoker._core.schema import Schema

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
MANIFEST_SUFFIX = ".stoker.json"
#: Refused before reading: a manifest for tens of thousands of shards stays far below this.
MAX_MANIFEST_BYTES = 64 << 20
_SHA_RE = re.compile(r"[0-9a-f]{64}\Z")


def _fail(path: str, reason: str) -> ManifestError:
    return ManifestError(f"{path}: {reason}")


def _int(path: str, where: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _fail(path, f"{where} must be a non-negative integer, got {v!r}")
    return v


def _rel_path(path: str, where: str, v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise _fail(path, f"{where} must be a non-empty relative path, got {v!r}")
    parts = v.replace("\\", "/").split("/")
    if os.path.isabs(v) or v.startswith(("/", "\\")) or ".." in parts or "\x00" in v:
        raise _fail(path, f"{where} {v!r} must stay inside the manifest's folder")
    if os.path.normpath(v.replace("\\", "/")) == "." or v.endswith(("/", "\\")):
        raise _fail(path, f"{where} {v!r} names a folder, not a file")
    return v


def _check_distinct(path: str, shards: list) -> None:
    """Each shard listed once: no ``.rec`` (or ``.idx``, or ``.crc32c``) named twice."""
    for field in ("rec", "idx", "crc32c"):
        seen: dict[str, int] = {}
        for j, s in enumerate(shards):
            v = s.get(field)
            if v is None:
                continue
            norm = os.path.normpath(v.replace("\\", "/"))
            if norm in seen:
                raise _fail(
                    path,
                    f"shards[{j}].{field} {v!r} is already shards[{seen[norm]}].{field}: "
                    "a shard may be listed once (its records would be read twice)",
                )
            seen[norm] = j


def validate_manifest(m: Any, path: str = "<manifest>") -> dict:
    """Check the schema; returns ``m``. Raises :class:`ManifestError` naming the field."""
    if not isinstance(m, dict):
        raise _fail(path, f"expected a JSON object, got {type(m).__name__}")
    if m.get("format") != FORMAT_NAME:
        raise _fail(path, f"format is {m.get('format')!r}, expected {FORMAT_NAME!r}")
    version = m.get("version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise _fail(
            path, f"version {version!r} is not supported (this stoker reads {FORMAT_VERSION})"
        )
    shards = m.get("shards")
    if not isinstance(shards, list):
        raise _fail(path, "shards must be a list")
    total = 0
    for j, s in enumerate(shards):
        w = f"shards[{j}]"
        if not isinstance(s, dict):
            raise _fail(path, f"{w} must be an object")
        _rel_path(path, f"{w}.rec", s.get("rec"))
        _rel_path(path, f"{w}.idx", s.get("idx"))
        total += _int(path, f"{w}.records", s.get("records"))
        _int(path, f"{w}.rec_bytes", s.get("rec_bytes"))
        sha = s.get("idx_sha256")
        if not isinstance(sha, str) or not _SHA_RE.match(sha):
            raise _fail(path, f"{w}.idx_sha256 must be 64 lowercase hex digits")
        crc = s.get("crc32c")
        if crc is not None:
            _rel_path(path, f"{w}.crc32c", crc)
    _check_distinct(path, shards)
    if _int(path, "records", m.get("records")) != total:
        raise _fail(path, f"records is {m.get('records')} but the shards hold {total}")
    classes = m.get("classes", {})
    if not isinstance(classes, dict):
        raise _fail(path, "classes must be an object {name: id}")
    ids = []
    for name, cid in classes.items():
        ids.append(_int(path, f"classes[{name!r}]", cid))
    if sorted(ids) != list(range(len(ids))):
        raise _fail(path, "class ids must be 0..C-1, each used once")
    for key in ("pack", "rejects"):
        if key in m and not isinstance(m[key], dict):
            raise _fail(path, f"{key} must be an object")
    if "schema" in m:
        manifest_schema(m, path)
    return m


def manifest_schema(m: Mapping[str, Any], path: str = "<manifest>") -> Schema | None:
    """The ``schema`` a manifest declares, or ``None`` for a set without one (an image and
    its label); :class:`ManifestError` naming the entry when it does not parse."""
    if "schema" not in m:
        return None
    try:
        return Schema.from_json(m["schema"], where="schema")
    except SpecError as e:
        raise _fail(path, str(e)) from None


def load_manifest(path: str | os.PathLike[str], *, max_bytes: int = MAX_MANIFEST_BYTES) -> dict:
    """Read and validate a manifest. The size is checked before reading; the bytes must be
    UTF-8 JSON (a pickle or any other binary named ``.stoker.json`` is refused, never run)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise _fail(p, f"manifest is {size} bytes, over the {max_bytes}-byte cap")
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise _fail(p, f"cannot read the manifest: {e.strerror or e}") from None
    if len(raw) > max_bytes:
        raise _fail(p, f"manifest grew past the {max_bytes}-byte cap while being read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(p, f"not a JSON manifest (not UTF-8 text at byte {e.start})") from None
    try:
        m = json.loads(text)
    except RecursionError:
        raise _fail(p, "not a usable JSON manifest (nested too deeply)") from None
    except ValueError as e:
        raise _fail(p, f"not a JSON manifest: {e}") from None
    return validate_manifest(m, p)


def write_manifest(path: str | os.PathLike[str], manifest: Mapping[str, Any]) -> None:
    """Validate and write ``manifest`` atomically (``.partial`` + fsync + rename)."""
    p = os.fspath(path)
    m = validate_manifest(dict(manifest), p)
    try:
        text = json.dumps(m, indent=1, ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"manifest for {p} is not JSON-serialisable: {e}") from None
    write_bytes_atomic(p, (text + "\n").encode("ascii"))


def class_names(manifest: Mapping[str, Any]) -> list[str]:
    """The class names of a validated manifest, in id order."""
    classes = manifest.get("classes") or {}
    names = [""] * len(classes)
    for name, cid in classes.items():
        names[cid] = name
    return names


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
