"""Version-1 manifests: one dialect per format, checked as they were and translated to the one
schema (version 2, :mod:`stoker.formats.manifest`) when they are opened.

A format's :class:`~stoker.formats.spec.Dialect` (its ``FORMAT.v1``) gives its ``format``
field (``"stoker-recordio"``) and each shard entry field's kind and version-2 place; nothing
here names a format. The version-1 top level was the version-2 one without ``kind`` and
``options``; the keys that were a format's own (TFRecord's ``features`` and ``key_feature``)
move under ``options``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from stoker.formats.manifest_json import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    check_count,
    check_distinct,
    check_rel_path,
    check_sha256,
    check_total,
    check_u32,
    fail,
)
from stoker.formats.spec import Format

__all__ = ["upgrade", "upgrade_entry"]

#: what a version-1 entry's field may hold, by the kind its dialect gives it
_KINDS: dict[str, Callable[[str, str, Any], Any]] = {
    "file": check_rel_path,
    "count": check_count,
    "sha256": check_sha256,
    "u32": check_u32,
}


def upgrade(path: str, m: dict, fmt: Format) -> dict:
    """The version-2 manifest of version-1 manifest ``m`` of format ``fmt``, after the
    checks its dialect had (:class:`ManifestError` names the version-1 field at fault)."""
    dialect = fmt.v1
    assert dialect is not None
    got = m.get("version")
    if got != 1 or isinstance(got, bool):
        raise fail(
            path,
            f"version {got!r} is not supported with format {dialect.format!r}, which is "
            f"version 1 only (a version-2 manifest's format is {MANIFEST_FORMAT!r})",
        )
    shards = m.get("shards")
    if not isinstance(shards, list):
        raise fail(path, "shards must be a list")
    for j, s in enumerate(shards):
        if not isinstance(s, dict):
            raise fail(path, f"shards[{j}] must be an object")
        for name, (kind, _) in dialect.entry.items():
            if kind.endswith("?") and s.get(name) is None:
                continue
            _KINDS[kind.rstrip("?")](path, f"shards[{j}].{name}", s.get(name))
    files = [n for n, (k, _) in dialect.entry.items() if k.rstrip("?") == "file"]
    check_distinct(path, shards, files)
    check_total(path, m, sum(s["records"] for s in shards))
    out = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "kind": fmt.name,
        **{k: v for k, v in m.items() if k not in ("format", "version", *dialect.options)},
        "shards": [upgrade_entry(fmt, s) for s in shards],
    }
    options = {k: m[k] for k in dialect.options if k in m}
    if options:
        out["options"] = options
    return out


def upgrade_entry(fmt: Format, s: Mapping[str, Any]) -> dict:
    """The version-2 shard entry of a version-1 one of format ``fmt`` (fields the dialect
    does not name, such as a writer's ``max_len``, are kept)."""
    dialect = fmt.v1
    assert dialect is not None
    out: dict[str, Any] = {"files": {}, "checksums": {}}
    for name, value in s.items():
        kind, where = dialect.entry.get(name, ("", ""))
        if not kind:
            out[name] = value
        elif value is None:
            continue
        elif kind.rstrip("?") == "file":
            out["files"][where] = value
        elif kind.rstrip("?") == "count":
            out[where] = value
        else:
            out["checksums"][where] = value
    return out
