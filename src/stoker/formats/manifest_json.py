"""A manifest's JSON, below the schema (:mod:`stoker.formats.manifest`) and its version-1
dialects (:mod:`stoker.formats.manifest_v1`): reading a manifest file size-capped and as UTF-8
JSON only (never unpickled, never evaluated), writing one atomically, and the field checks that
name the field at fault (counts, relative paths inside the manifest's folder, checksums,
classes, the schema). :mod:`stoker.formats.manifest` names all of these too; import them from
there.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from stoker._core.atomic import write_bytes_atomic
from stoker._core.errors import ManifestError, SpecError
from stoker._core.jsondoc import DuplicateKeyError, unique_keys
from stoker._core.schema import Schema

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_VERSION",
    "MANIFEST_SUFFIX",
    "MAX_MANIFEST_BYTES",
    "check_classes",
    "check_count",
    "check_distinct",
    "check_rel_path",
    "check_sha256",
    "check_total",
    "check_u32",
    "class_names",
    "fail",
    "manifest_schema",
    "read_json",
    "write_json",
]

#: The ``format`` and ``version`` of every manifest this stoker writes.
MANIFEST_FORMAT = "stoker"
MANIFEST_VERSION = 2
MANIFEST_SUFFIX = ".stoker.json"
#: Refused before reading: a manifest for tens of thousands of shards stays far below this.
MAX_MANIFEST_BYTES = 64 << 20
_SHA_RE = re.compile(r"[0-9a-f]{64}\Z")


def fail(path: str, reason: str) -> ManifestError:
    return ManifestError(f"{path}: {reason}")


def check_count(path: str, where: str, v: Any) -> int:
    """A non-negative int (not a bool), or ``ManifestError`` naming ``where``."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise fail(path, f"{where} must be a non-negative integer, got {v!r}")
    return v


def check_rel_path(path: str, where: str, v: Any) -> str:
    """A relative file path inside the manifest's folder (no ``..``, not absolute, no NUL,
    not a folder), or ``ManifestError`` naming ``where``; a URL is checked where the set opens
    (:meth:`~stoker.formats.remote.RemoteFiles.url_of`: its host must be allowed)."""
    if not isinstance(v, str) or not v:
        raise fail(path, f"{where} must be a non-empty relative path, got {v!r}")
    if "://" in v:
        return v
    parts = v.replace("\\", "/").split("/")
    if (
        os.path.isabs(v)
        or v.startswith(("/", "\\"))
        or ".." in parts
        or "\x00" in v
        or ":" in parts[0]
    ):
        raise fail(path, f"{where} {v!r} must stay inside the manifest's folder")
    if os.path.normpath(v.replace("\\", "/")) == "." or v.endswith(("/", "\\")):
        raise fail(path, f"{where} {v!r} names a folder, not a file")
    return v


def check_distinct(path: str, shards: list, fields: Iterable[str], under: str = "") -> None:
    """Each shard listed once: no file (under any of ``fields`` of each entry, or of its
    ``under`` object) named twice."""
    for field in fields:
        seen: dict[str, int] = {}
        for j, s in enumerate(shards):
            v = (s.get(under) or {}).get(field) if under else s.get(field)
            if v is None:
                continue
            norm = os.path.normpath(v.replace("\\", "/"))
            at = f"{under}.{field}" if under else field
            if norm in seen:
                raise fail(
                    path,
                    f"shards[{j}].{at} {v!r} is already shards[{seen[norm]}].{at}: "
                    "a shard may be listed once (its records would be read twice)",
                )
            seen[norm] = j


def check_sha256(path: str, where: str, v: Any) -> str:
    """64 lowercase hex digits, or ``ManifestError`` naming ``where``."""
    if not isinstance(v, str) or not _SHA_RE.match(v):
        raise fail(path, f"{where} must be 64 lowercase hex digits")
    return v


def check_u32(path: str, where: str, v: Any) -> int:
    """An unsigned 32-bit int (a CRC), or ``ManifestError`` naming ``where``."""
    if type(v) is not int or not 0 <= v < 1 << 32:
        raise fail(path, f"{where} must be an unsigned 32-bit integer")
    return v


def check_total(path: str, m: Mapping[str, Any], total: int) -> None:
    """``records`` equals the shards' sum."""
    if check_count(path, "records", m.get("records")) != total:
        raise fail(path, f"records is {m.get('records')} but the shards hold {total}")


def check_classes(path: str, m: Mapping[str, Any]) -> None:
    classes = m.get("classes", {})
    if not isinstance(classes, dict):
        raise fail(path, "classes must be an object {name: id}")
    ids = [check_count(path, f"classes[{name!r}]", cid) for name, cid in classes.items()]
    if sorted(ids) != list(range(len(ids))):
        raise fail(path, "class ids must be 0..C-1, each used once")
    for key in ("pack", "rejects", "options"):
        if key in m and not isinstance(m[key], dict):
            raise fail(path, f"{key} must be an object")
    if "schema" in m:
        manifest_schema(m, path)


def manifest_schema(m: Mapping[str, Any], path: str = "<manifest>") -> Schema | None:
    """The ``schema`` a manifest declares, or ``None`` for a set without one (an image and
    its label); :class:`ManifestError` naming the entry when it does not parse."""
    if "schema" not in m:
        return None
    try:
        return Schema.from_json(m["schema"], where="schema")
    except SpecError as e:
        raise fail(path, str(e)) from None


def class_names(manifest: Mapping[str, Any]) -> list[str]:
    """The class names of a validated manifest, in id order."""
    classes = manifest.get("classes") or {}
    names = [""] * len(classes)
    for name, cid in classes.items():
        names[cid] = name
    return names


def read_json(path: str | os.PathLike[str], *, max_bytes: int = MAX_MANIFEST_BYTES) -> Any:
    """The JSON value of a manifest file, unchecked. The size is checked before reading; the
    bytes must be UTF-8 JSON (a pickle or any other binary named ``.stoker.json`` is refused,
    never run)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise fail(p, f"manifest is {size} bytes, over the {max_bytes}-byte cap")
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise fail(p, f"cannot read the manifest: {e.strerror or e}") from None
    if len(raw) > max_bytes:
        raise fail(p, f"manifest grew past the {max_bytes}-byte cap while being read")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise fail(p, f"not a JSON manifest (not UTF-8 text at byte {e.start})") from None
    try:
        return json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKeyError as e:
        raise fail(p, f"not a usable JSON manifest: {e} (which one is meant?)") from None
    except RecursionError:
        raise fail(p, "not a usable JSON manifest (nested too deeply)") from None
    except ValueError as e:
        raise fail(p, f"not a JSON manifest: {e}") from None


def write_json(path: str | os.PathLike[str], m: Mapping[str, Any]) -> None:
    """Write a (validated) manifest atomically (``.partial`` + fsync + rename)."""
    p = os.fspath(path)
    try:
        text = json.dumps(dict(m), indent=1, ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"manifest for {p} is not JSON-serialisable: {e}") from None
    write_bytes_atomic(p, (text + "\n").encode("ascii"))
