"""The ``NAME.stoker.json`` side-car of every format: one schema (version 2), one validator,
one ``load``.

Every stoker-written set, whatever its format, has one manifest::

    {
      "format": "stoker", "version": 2,
      "kind": "recordio",                     # the format's registry name (FORMAT.name)
      "records": 1200,                        # sum over shards
      "shards": [
        {"files": {"data": "train-00000.rec", "index": "train-00000.idx",
                   "crc": "train-00000.crc32c"},   # by role (FORMAT.roles), relative paths
         "records": 600,
         "bytes": 2457600,                    # of the data file
         "checksums": {"index.sha256": "<64 hex>", "data.crc32c": 3735928559}},
        ...
      ],
      "classes": {"cat": 0, "dog": 1},        # ids 0..C-1 (may be empty)
      "schema": {...},                        # optional: stoker._core.schema.Schema.to_json()
      "options": {...},                       # what only this format reads (TFRecord: features)
      "pack": {...}, "rejects": {...}         # free-form objects
    }

A checksum is named ``ROLE.ALGORITHM``: ``sha256`` (64 lowercase hex digits) or ``crc32c``
(an unsigned 32-bit int) of the file of that role. Which roles and checksums an entry must
have, and how ``options`` is checked, come from the format's :class:`~stoker.formats.spec.
Format` (``required``, ``checksums``, ``options``); nothing here names a format.

A manifest is untrusted input: it is size-capped before it is read, must be UTF-8 JSON (never
unpickled, never evaluated), and every path it names must be relative, inside the manifest's
folder, without ``..``. :class:`~stoker._core.errors.ManifestError` names the field at fault.

Version-1 manifests (one dialect per format: ``"format": "stoker-recordio"`` ...) still open:
each format's ``v1`` :class:`~stoker.formats.spec.Dialect` says what its fields were, they are
checked as they were and translated on load. :func:`load` returns the version-2 manifest with
its shards as :class:`~stoker.formats.shards.ShardEntry` objects.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from stoker._core.schema import Schema
from stoker.formats import manifest_json
from stoker.formats.manifest_json import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    MAX_MANIFEST_BYTES,
    check_classes,
    check_count,
    check_distinct,
    check_rel_path,
    check_sha256,
    check_total,
    check_u32,
    fail,
    manifest_schema,
    read_json,
    write_json,
)
from stoker.formats.manifest_json import MANIFEST_SUFFIX as MANIFEST_SUFFIX  # named by __all__
from stoker.formats.manifest_json import class_names as class_names  # named by __all__
from stoker.formats.manifest_v1 import upgrade, upgrade_entry
from stoker.formats.shards import ShardEntry
from stoker.formats.spec import FORMATS, Format, lookup  # FORMATS: filled by the registry

__all__ = [
    "entry_json",
    "kind_of",
    "load",
    "longest",
    "make",
    "manifest_kind",
    "parse",
    "shard_file",
    "validate",
    "write_set",
]
__all__ += manifest_json.__all__  # the JSON helpers are named here too

#: What a checksum's name ends in, and how its value is checked.
_ALGORITHMS = ("sha256", "crc32c")


def _known() -> list[str]:
    fmts = [f for f in FORMATS.values() if f.manifest is not None]
    return sorted([f.name for f in fmts] + [f.v1.format for f in fmts if f.v1 is not None])


def kind_of(m: Any, path: str = "<manifest>") -> str:
    """The registry name of the format manifest ``m`` (its JSON value) describes: its
    ``kind``, or for a version-1 manifest the format whose dialect its ``format`` names."""
    if not isinstance(m, dict):
        raise fail(path, f"a manifest is a JSON object, got a {type(m).__name__}")
    name = m.get("format")
    if name == MANIFEST_FORMAT:
        kind = m.get("kind")
        fmt = lookup(kind)
        if fmt is None or fmt.manifest is None:
            raise fail(path, f"kind {kind!r} is not a format stoker reads (it reads {_known()})")
        return fmt.name
    if not isinstance(name, str):
        raise fail(path, "no format field: not a stoker manifest")
    for fmt in FORMATS.values():
        if fmt.v1 is not None and fmt.v1.format == name:
            return fmt.name
    raise fail(path, f"format {name!r} is not one stoker reads (it reads {_known()})")


def manifest_kind(path: str | os.PathLike[str]) -> str:
    """The registry name of the format of the manifest at ``path`` (read with the checks of
    :func:`read_json`; the rest is not checked)."""
    return kind_of(read_json(path), os.fspath(path))


def validate(m: Any, path: str = "<manifest>", kind: str | None = None) -> dict:
    """Check manifest ``m`` (``kind``: the format it must describe); a version-1 manifest is
    checked as its dialect was and translated. Returns the version-2 manifest (JSON values);
    :class:`ManifestError` names the field at fault."""
    got = kind_of(m, path)
    if kind is not None and got != kind:
        raise fail(path, f"this manifest describes a {got} set, not a {kind} one")
    fmt = FORMATS[got]
    if m.get("format") != MANIFEST_FORMAT:
        m = upgrade(path, m, fmt)
    version = m.get("version")
    if version != MANIFEST_VERSION or isinstance(version, bool):
        raise fail(path, f"version {version!r} is not supported (this stoker reads 1 and 2)")
    shards = m.get("shards")
    if not isinstance(shards, list):
        raise fail(path, "shards must be a list")
    for j, s in enumerate(shards):
        _check_entry(path, f"shards[{j}]", s, fmt)
    check_distinct(path, shards, fmt.roles, under="files")
    check_total(path, m, sum(s["records"] for s in shards))
    check_classes(path, m)
    if fmt.options is not None:
        fmt.load("options")(path, m.get("options") or {}, manifest_schema(m, path))
    return m


def _check_entry(path: str, where: str, s: Any, fmt: Format) -> None:
    """One ``shards[]`` entry of a ``fmt`` set."""
    if not isinstance(s, dict):
        raise fail(path, f"{where} must be an object")
    files = s.get("files")
    if not isinstance(files, dict):
        raise fail(path, f"{where}.files must be an object {{role: file}}")
    for role, name in files.items():
        if role not in fmt.roles:
            raise fail(path, f"{where}.files.{role}: {fmt.name} has no role {role!r}")
        check_rel_path(path, f"{where}.files.{role}", name)
    for role in fmt.required:
        if role not in files:
            raise fail(path, f"{where}.files.{role} is missing (a {fmt.name} shard has one)")
    check_count(path, f"{where}.records", s.get("records"))
    check_count(path, f"{where}.bytes", s.get("bytes"))
    sums = s.get("checksums", {})
    if not isinstance(sums, dict):
        raise fail(path, f"{where}.checksums must be an object {{ROLE.ALGORITHM: value}}")
    for name, value in sums.items():
        role, _, algo = str(name).rpartition(".")
        if role not in fmt.roles or algo not in _ALGORITHMS:
            raise fail(
                path,
                f"{where}.checksums.{name}: a checksum is named ROLE.ALGORITHM, a role of "
                f"{sorted(fmt.roles)} and one of {list(_ALGORITHMS)}",
            )
        check = check_sha256 if algo == "sha256" else check_u32
        check(path, f"{where}.checksums.{name}", value)
    for name in fmt.checksums:
        if name not in sums:
            raise fail(path, f"{where}.checksums.{name} is missing (a {fmt.name} shard has one)")


def parse(m: Any, path: str = "<manifest>", kind: str | None = None) -> dict:
    """:func:`validate`, then the shards as :class:`ShardEntry` objects."""
    v = validate(m, path, kind)
    shards = [
        ShardEntry(
            records=s["records"],
            files=dict(s["files"]),
            bytes=s["bytes"],
            checksums=dict(s.get("checksums", {})),
        )
        for s in v["shards"]
    ]
    return {**v, "shards": shards}


def load(
    path: str | os.PathLike[str],
    *,
    kind: str | None = None,
    max_bytes: int = MAX_MANIFEST_BYTES,
) -> dict:
    """Read (size-capped, UTF-8 JSON, never unpickled), check and translate the manifest at
    ``path``; its shards are :class:`ShardEntry` objects (see :func:`parse`)."""
    return parse(read_json(path, max_bytes=max_bytes), os.fspath(path), kind)


def shard_file(manifest_path: str | os.PathLike[str], entry: ShardEntry, role: str) -> str | None:
    """The file of ``role`` of ``entry``, resolved against the manifest's folder."""
    return entry.path(role, os.path.dirname(os.path.abspath(os.fspath(manifest_path))))


def entry_json(kind: str, shard: Mapping[str, Any], manifest_path: str, where: str) -> dict:
    """The version-2 ``shards[]`` entry of a shard writer's ``commit()`` entry (a version-2
    entry, or one in the format's version-1 dialect, as side-cars of earlier runs hold);
    absolute paths are made relative to the manifest's folder."""
    fmt = FORMATS[kind]
    if "files" not in shard and fmt.v1 is not None:
        shard = upgrade_entry(fmt, shard)
    base = os.path.dirname(os.path.abspath(manifest_path))
    files = {}
    for role, name in dict(shard.get("files") or {}).items():
        if name is not None and os.path.isabs(os.fspath(name)):
            name = os.path.relpath(os.fspath(name), base)
        files[role] = check_rel_path(manifest_path, f"{where}.files.{role}", name)
    entry = ShardEntry(
        records=int(shard["records"]),
        files=files,
        bytes=int(shard["bytes"]),
        checksums=dict(shard.get("checksums") or {}),
    )
    return entry.to_json()


def make(
    kind: str,
    shards: Sequence[Mapping[str, Any]],
    *,
    classes: Mapping[str, int] | None = None,
    schema: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    pack: Mapping[str, Any] | None = None,
    rejects: Mapping[str, Any] | None = None,
    path: str = "<manifest>",
) -> dict:
    """A checked version-2 manifest of a ``kind`` set from its version-2 shard entries
    (``schema``: ``Schema.to_json()``; ``None``: no ``schema`` key)."""
    m: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "kind": kind,
        "records": sum(int(s["records"]) for s in shards),
        "shards": [dict(s) for s in shards],
        "classes": dict(classes or {}),
    }
    if schema is not None:
        m["schema"] = dict(schema)
    if options:
        m["options"] = dict(options)
    m["pack"], m["rejects"] = dict(pack or {}), dict(rejects or {})
    return validate(m, path, kind)


def longest(shards: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The longest value of each variable field over shards' ``commit()`` entries (their
    ``max_len``)."""
    out: dict[str, int] = {}
    for s in shards:
        for name, n in (s.get("max_len") or {}).items():
            out[name] = max(out.get(name, 0), int(n))
    return out


def write_set(
    kind: str,
    manifest_path: str | os.PathLike[str],
    shards: Sequence[Mapping[str, Any]],
    *,
    schema: Schema | None = None,
    **fields: Any,
) -> None:
    """Write the manifest of a ``kind`` set from its shards' ``commit()`` entries, in order,
    checked, atomically: the set's commit point. ``schema``: ``None`` writes no ``schema`` key
    (an image and its label); a variable field without ``max_len`` gets the longest value
    the shards saw. ``fields``: the other keywords of :func:`make`."""
    p = os.fspath(manifest_path)
    entries = [entry_json(kind, s, p, f"shards[{j}]") for j, s in enumerate(shards)]
    if schema is not None:
        seen = longest(shards)
        schema = schema.with_max_len(
            {n: v for n, v in seen.items() if n in schema and schema[n].max_len is None}
        )
    made = make(
        kind, entries, path=p, schema=None if schema is None else schema.to_json(), **fields
    )
    write_json(p, made)
