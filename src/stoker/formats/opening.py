"""One way to open a set: what a path names, resolved once for every format made of shards.

:func:`open_set` takes a path (or URL) and a format's name and says what a reader reads:

- a URL other than ``file://``: the manifest there, read through the node's shard cache, and
  its shards as a :class:`~stoker.formats.shardfiles.RemoteShards` (each shard's files are its
  entry's files by role, in the order of the format's ``FORMAT.roles``);
- a ``NAME.stoker.json``: the manifest and all of its shards;
- a bare shard that the manifest beside it lists (:func:`sibling_manifest`): that manifest and the one entry naming
  this file, so the shard is read as the manifest declares it (fields, class names);
- anything else: a bare file, no manifest.

What stays the format's own: how a shard's files are opened and checked against the entry.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stoker._core.errors import ManifestError
from stoker.formats.manifest import (
    MANIFEST_SUFFIX,
    load,
    manifest_kind,
    parse,
    read_json,
    shard_file,
)
from stoker.formats.manifest_json import class_names
from stoker.formats.remote import (
    RemoteFiles,
    RemoteOptions,
    is_url,
    local_path,
    redact,
    remote_url,
)
from stoker.formats.shardfiles import REINDEX, RemoteShards, ShardFile
from stoker.formats.shards import MAX_OPEN_SHARDS, ShardEntry
from stoker.formats.spec import FORMATS

__all__ = [
    "Opened",
    "cache_url",
    "check_entry",
    "open_remote",
    "open_set",
    "sibling_manifest",
]

_SHARD_NUMBER = re.compile(r"-\d{5,}$")


@dataclass
class Opened:
    """What :func:`open_set` found: ``path`` (a ``file://`` URL as its local path),
    ``manifest_path`` (the local manifest, the redacted URL of a remote one, or ``None`` for a
    bare file), the loaded ``manifest``, the ``entries`` to read and, for a URL, ``remote``."""

    path: str
    manifest_path: str | None = None
    manifest: dict | None = None
    entries: list[ShardEntry] = field(default_factory=list)
    remote: RemoteShards | None = None

    @property
    def class_names(self) -> list[str] | None:
        """The manifest's class names (``None``: no manifest, or it declares none)."""
        return None if self.manifest is None else class_names(self.manifest) or None


def sibling_manifest(path: str, kind: str) -> str | None:
    """The manifest that sits beside a bare shard: ``PREFIX.stoker.json`` for
    ``PREFIX-00007.tar`` or ``PREFIX.tfrecord``, when it exists and describes a set of format
    ``kind`` (:func:`open_set` checks that it lists the shard); else ``None``."""
    stem = os.path.splitext(os.path.abspath(path))[0]
    candidate = _SHARD_NUMBER.sub("", stem) + MANIFEST_SUFFIX
    if not os.path.isfile(candidate):
        return None
    try:
        name = manifest_kind(candidate)
    except ManifestError:
        return None  # not ours to read here: the bare shard is read as it is
    return candidate if name == kind else None


def _same(a: str, b: str) -> bool:
    """Whether two paths name one file (a manifest's shard entry and a path given by hand)."""
    try:
        return os.path.abspath(a) == os.path.abspath(b) or os.path.samefile(a, b)
    except OSError:
        return False


def check_entry(manifest_path: str, s: ShardEntry, roles: Iterable[str], hint: str = "") -> None:
    """What can be checked of shard entry ``s`` without opening its files (a ``stat`` each),
    for each of ``roles`` it names: the file is there and not a folder, the data file has the
    ``bytes`` the entry records, a ``crc`` side file holds 4 bytes per record.
    :class:`ManifestError` names the manifest, the file and its shard (``hint``: how to read
    without a missing ``crc`` file)."""
    data = s.files["data"]
    for role in roles:
        p = shard_file(manifest_path, s, role)
        if p is None:
            continue
        try:
            st = os.stat(p)
        except OSError as e:
            gone = isinstance(e, FileNotFoundError)
            raise ManifestError(
                f"{manifest_path}: the {role} file {p} that the manifest names for shard "
                f"{data!r} cannot be read: {'it does not exist' if gone else e.strerror or e}"
                f"{hint if gone and role == 'crc' else ''}"
            ) from None
        if stat.S_ISDIR(st.st_mode):
            raise ManifestError(
                f"{manifest_path}: shard {s.files[role]!r} (field files.{role}) names a "
                "directory, not a file"
            )
        if role == "data" and s.bytes is not None and st.st_size != s.bytes:
            raise ManifestError(
                f"{manifest_path}: {p} is {st.st_size} bytes but the manifest records "
                f"{s.bytes}; the shard was replaced or truncated"
                f"{REINDEX if 'index' in s.files else ''}"
            )
        if role == "crc" and st.st_size != 4 * s.records:
            raise ManifestError(
                f"{manifest_path}: the checksum file {p} holds {st.st_size} bytes, not 4 bytes "
                f"for each record: the {s.records} records of shard {data!r} need "
                f"{4 * s.records} (truncated, or it belongs to another shard)"
            )


def _files(files: RemoteFiles, j: int, s: ShardEntry, roles: Iterable[str]) -> list[ShardFile]:
    """The files of shard ``j`` (entry ``s``) of a remote set as the shard cache fetches them:
    each of ``roles`` the entry names, in that order. The data file has the entry's ``bytes``
    (and its CRC32C or sha256 where the entry records one), a ``crc`` side file 4 bytes per
    record, any other file the size listed at open."""
    out = []
    for role in [r for r in roles if r in s.files]:
        name, where = s.files[role], f"shards[{j}].files.{role}"
        if role == "data":
            crc, sha = s.checksums.get("data.crc32c"), s.checksums.get("data.sha256")
            crc, sha = None if crc is None else int(crc), None if sha is None else str(sha)
            out.append(ShardFile(name, where, int(s.bytes or 0), crc32c=crc, sha256=sha))
        else:
            size = 4 * int(s.records) if role == "crc" else files.size_of(files.url_of(name, where))
            out.append(ShardFile(name, where, size))
    return out


def cache_url(manifest_path: str, entries: Iterable[ShardEntry]) -> str | None:
    """The ``file://`` URL a local manifest is read through (the shard cache, as a remote set
    is) when its ``entries`` name files by URL, on other storage (``stoker index`` of tars it
    cannot write beside); ``None`` when every file is beside it."""
    if any(is_url(f) for s in entries for f in s.files.values()):
        return "file://" + os.path.abspath(manifest_path)
    return None


def open_remote(
    files: RemoteFiles,
    kind: str,
    opened: RemoteShards | None = None,
    roles: Sequence[str] | None = None,
    **kw: Any,
) -> tuple[RemoteShards, dict]:
    """The opener and the manifest of the ``kind`` set whose manifest ``files`` reads through
    the shard cache: the manifest checked, each shard's files (``roles``: those read, default
    the format's) listed with their sizes (one listing per folder) and the cache's room
    checked, unless a process of this run listed them already. ``opened``: the set as another
    process opened it (unpickled), whose checks are not repeated. ``kw``: the
    :class:`RemoteShards` options."""
    m = parse(read_json(files.manifest_copy()), redact(files.url), kind)
    if opened is not None:
        return opened, m
    roles = roles or list(FORMATS[kind].roles)
    fresh = not files.sizes
    if fresh:
        files.list_sizes(
            files.url_of(s.files[role], f"shards[{j}].files.{role}")
            for j, s in enumerate(m["shards"])
            for role in roles
            if role in s.files
        )
    each = [_files(files, j, s, roles) for j, s in enumerate(m["shards"])]
    shards = RemoteShards(files, each, cap=MAX_OPEN_SHARDS, **kw)
    if fresh:
        shards.check()
    return shards, m


def open_set(
    path: str | os.PathLike[str],
    kind: str,
    *,
    remote: RemoteOptions | None = None,
    opened: RemoteShards | None = None,
    sibling: bool | str = True,
    roles: Sequence[str] | None = None,
    marks: int | None = None,
) -> Opened:
    """What ``path`` names for a reader of format ``kind``; see the module docstring.
    ``remote`` and ``opened``: a URL's options and its set as another process opened it (its
    reader keeps :data:`MAX_OPEN_SHARDS` open at most). ``sibling``: where a bare shard's
    manifest is looked for (``True``: :func:`sibling_manifest`; a path: that file when it
    exists; ``False``: nowhere). ``roles`` and ``marks``: a URL's files fetched for each shard
    (default: the format's roles) and the markers the shard cache reserves (see
    :class:`RemoteShards`)."""
    p = os.fspath(path)
    url = remote_url(p)
    if url is not None and not url.endswith(MANIFEST_SUFFIX):
        raise ValueError(
            f"{redact(url)}: a {kind} set in object storage is opened by its manifest "
            f"(NAME{MANIFEST_SUFFIX}, which `stoker pack` writes beside the shards)"
        )
    if url is not None:
        files = RemoteFiles(url, remote) if opened is None else opened.files
        shards, m = open_remote(files, kind, opened, roles, marks=marks)
        return Opened(url, redact(url), m, m["shards"], shards)
    p = local_path(p)
    if p.endswith(MANIFEST_SUFFIX):
        cached = None if opened is None else opened.files
        if cached is None:
            m = load(p, kind=kind)
            if (through := cache_url(p, m["shards"])) is None:
                return Opened(p, p, m, m["shards"])
            cached = RemoteFiles(through, remote)
        shards, m = open_remote(cached, kind, opened, roles, marks=marks)
        return Opened(p, p, m, m["shards"], shards)
    if sibling is True:
        beside = sibling_manifest(p, kind)
    else:
        beside = sibling if sibling and os.path.exists(sibling) else None
    if beside is not None:
        m = load(beside, kind=kind)
        for s in m["shards"]:
            if _same(str(shard_file(beside, s, "data")), p):
                return Opened(p, beside, m, [s])
    return Opened(p)
