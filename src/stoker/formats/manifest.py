"""The ``NAME.stoker.json`` side-car of any format: the parts every format's manifest shares.

Every stoker-written set, whatever its format, has one manifest::

    {
      "format": "stoker-<name>",            # "stoker-recordio", "stoker-tfrecord", "stoker-wds"
      "version": 1,
      "records": 1200,                      # sum over shards
      "shards": [{...}, ...],               # one entry per shard; its keys are the format's
      "classes": {"cat": 0, "dog": 1},      # ids 0..C-1 (may be empty)
      "schema": {...},                      # optional: stoker._core.schema.Schema.to_json()
      "pack": {...}, "rejects": {...}       # free-form objects
    }

A manifest is untrusted input: it is size-capped before it is read, must be UTF-8 JSON (never
unpickled, never evaluated), and every path it names must be relative, inside the manifest's
folder, without ``..``. This module checks the shared parts; each format checks its own shard
entries with :func:`check_rel_path` and :func:`check_count` and names the field at fault.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from stoker._core.atomic import write_bytes_atomic
from stoker._core.errors import ManifestError, SpecError
from stoker._core.jsondoc import DuplicateKeyError, unique_keys
from stoker._core.schema import Schema

__all__ = [
    "MANIFEST_SUFFIX",
    "MAX_MANIFEST_BYTES",
    "check_classes",
    "check_count",
    "check_distinct",
    "check_head",
    "check_total",
    "check_rel_path",
    "check_sha256",
    "check_shards",
    "check_u32",
    "class_names",
    "fail",
    "manifest_format",
    "manifest_schema",
    "read_json",
    "write_json",
]

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
    not a folder), or ``ManifestError`` naming ``where``."""
    if not isinstance(v, str) or not v:
        raise fail(path, f"{where} must be a non-empty relative path, got {v!r}")
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


def check_distinct(path: str, shards: list, fields: Iterable[str]) -> None:
    """Each shard listed once: no file (under any of ``fields``) named twice."""
    for field in fields:
        seen: dict[str, int] = {}
        for j, s in enumerate(shards):
            v = s.get(field)
            if v is None:
                continue
            norm = os.path.normpath(v.replace("\\", "/"))
            if norm in seen:
                raise fail(
                    path,
                    f"shards[{j}].{field} {v!r} is already shards[{seen[norm]}].{field}: "
                    "a shard may be listed once (its records would be read twice)",
                )
            seen[norm] = j


def check_head(path: str, m: Any, format_name: str, version: int) -> list[dict]:
    """The checks every format's manifest starts with: a JSON object of ``format_name`` and
    ``version`` whose ``shards`` is a list of objects; returns the shards."""
    if not isinstance(m, dict):
        raise fail(path, f"expected a JSON object, got {type(m).__name__}")
    if m.get("format") != format_name:
        raise fail(path, f"format is {m.get('format')!r}, expected {format_name!r}")
    got = m.get("version")
    if got != version or isinstance(got, bool):
        raise fail(path, f"version {got!r} is not supported (this stoker reads {version})")
    shards = m.get("shards")
    if not isinstance(shards, list):
        raise fail(path, "shards must be a list")
    for j, s in enumerate(shards):
        if not isinstance(s, dict):
            raise fail(path, f"shards[{j}] must be an object")
    return shards


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


#: what a shard entry's field may hold, by the kind a format's entry table gives it
_KINDS: dict[str, Callable[[str, str, Any], Any]] = {
    "file": check_rel_path,
    "count": check_count,
    "sha256": check_sha256,
    "u32": check_u32,
}


def check_shards(
    path: str, m: Any, format_name: str, version: int, entry: Mapping[str, str]
) -> dict:
    """Check a whole manifest whose shard entries hold the fields of ``entry``, a table
    ``{field: kind}`` in the order they are checked: ``"file"`` (a relative path, listed once
    across the shards), ``"count"``, ``"sha256"`` or ``"u32"``, optional when the kind ends
    in ``?``. Every entry has ``records``; their sum is the manifest's. Returns ``m``;
    :class:`ManifestError` names the field at fault."""
    shards = check_head(path, m, format_name, version)
    for j, s in enumerate(shards):
        for name, kind in entry.items():
            if kind.endswith("?") and s.get(name) is None:
                continue
            _KINDS[kind.rstrip("?")](path, f"shards[{j}].{name}", s.get(name))
    check_distinct(path, shards, [n for n, k in entry.items() if k.rstrip("?") == "file"])
    check_total(path, m, sum(s["records"] for s in shards))
    check_classes(path, m)
    return m


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
    for key in ("pack", "rejects"):
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


def manifest_format(path: str | os.PathLike[str]) -> str:
    """The ``format`` field of a manifest (``"stoker-recordio"``, ...), read with the checks of
    :func:`read_json`."""
    m = read_json(path)
    if not isinstance(m, dict):
        raise fail(os.fspath(path), f"a manifest is a JSON object, got a {type(m).__name__}")
    fmt = m.get("format")
    if not isinstance(fmt, str):
        raise fail(os.fspath(path), "no format field: not a stoker manifest")
    return fmt


_SHARD_NUMBER = re.compile(r"-\d{5,}$")


def sibling_manifest(path: str, format_name: str) -> str | None:
    """The manifest that sits beside a bare shard and names it: ``PREFIX.stoker.json`` for
    ``PREFIX-00007.tar`` or ``PREFIX.tfrecord``, when it exists and its ``format`` is
    ``format_name`` (the caller checks that it lists the shard); else ``None``. A reader that
    finds one reads the shard through it, so the shard keeps the fields and class names the
    manifest declares."""
    stem = os.path.splitext(os.path.abspath(path))[0]
    candidate = _SHARD_NUMBER.sub("", stem) + MANIFEST_SUFFIX
    if not os.path.isfile(candidate):
        return None
    try:
        name = manifest_format(candidate)
    except ManifestError:
        return None  # not ours to read here: the bare shard is read as it is
    return candidate if name == format_name else None


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (a manifest's shard entry and a path given by hand)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def write_json(path: str | os.PathLike[str], m: Mapping[str, Any]) -> None:
    """Write a (validated) manifest atomically (``.partial`` + fsync + rename)."""
    p = os.fspath(path)
    try:
        text = json.dumps(dict(m), indent=1, ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"manifest for {p} is not JSON-serialisable: {e}") from None
    write_bytes_atomic(p, (text + "\n").encode("ascii"))
