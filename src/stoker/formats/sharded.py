"""The one reader of a set made of shards: a format gives a :class:`~stoker.formats.base.Shard`
and a ``FORMAT``; :class:`ShardedReader` makes the set.

What the set does, once for every format:

- opening (:func:`~stoker.formats.opening.open_set`): a manifest, a bare shard that a sibling
  manifest lists, a bare file or a URL; each manifest entry checked against its files once
  (local: a ``stat`` each; a URL: one listing, in :class:`~stoker.formats.shardfiles.
  RemoteShards`); each shard's record count against its entry when the shard opens;
- the shards: opened on first use through the format's shard class (``FORMAT.open_shard``)
  with the files of their entry (:class:`ShardFiles`: local paths, or pinned cached copies of
  a set in object storage, let go when the shard closes), at most ``MAX_OPEN_SHARDS`` open
  (mapped) at once, the least recently used closed first;
- positions, keys and labels concatenated over the shards, the schema (declared, or every
  shard's, which must agree), ``locate``, ``describe``, ``files``, ``shard_sizes``,
  ``block_sizes`` (each shard's ``blocks``), ``fingerprint``, and the remote hooks
  (:class:`~stoker.formats.shardfiles.ReadsRemoteShards`).

A format says what it knows before any shard is open in a :class:`SetPlan` (its shard class's
``plan(manifest, where, **options)``): what every shard reads with, a declared schema, whether
keys are stored, the roles of the files a shard reads.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError, ManifestError, SpecError, StokerFormatError
from stoker._core.schema import SIZE_FIELD, Schema
from stoker.formats.base import Reader, ReadSample, Shard
from stoker.formats.manifest import shard_file
from stoker.formats.opening import Opened, check_entry, open_set
from stoker.formats.remote import RemoteOptions, local_path
from stoker.formats.shardfiles import ReadsRemoteShards, RemoteShards
from stoker.formats.shards import MAX_OPEN_SHARDS, OpenShards, ShardEntry, ShardSet, digest
from stoker.formats.spec import FORMATS

__all__ = [
    "MAX_KEPT_SHARDS",
    "RemoteOptions",
    "SetPlan",
    "ShardFiles",
    "ShardedReader",
    "local_path",
]

#: Opened shards (their indexes: offsets, keys, labels) a set keeps per process; the least
#: recently used beyond it is forgotten and opened again when next read, so a worker's memory
#: over a set of 40,000 shards stays that of this many.
MAX_KEPT_SHARDS = 1024


@dataclass(frozen=True)
class SetPlan:
    """What a format knows of a set before a shard is open: ``read`` (what every shard reads
    with: the format's own), ``schema`` (declared; ``None``: the shards'), ``keyed``
    (``False``: the positions are the keys, no shard is opened for them), ``label_kind``
    (one label's ``(shape, dtype)`` where known without a shard), ``roles`` (the files of an
    entry checked and read), ``keys_from`` (where stored keys come from, for messages) and
    ``blocks`` (whether shards may declare blocks: only then are they opened for them) and
    ``extra`` (the format's own; ``"hint"``: what a missing file's error adds)."""

    read: Any = None
    schema: Schema | None = None
    keyed: bool | None = None
    label_kind: tuple[tuple[int, ...], str] | None = None
    roles: tuple[str, ...] = ("data",)
    keys_from: str = "stored keys"
    blocks: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class ShardFiles:
    """The files of one shard by role as its shard opens them: local paths, or for a set in
    object storage pinned cached copies (:meth:`path` holds them, :meth:`let_go` lets go).
    ``where``: the data file's path or URL, for messages; ``entry``: its manifest entry
    (``None``: a bare file); ``identity``: what a remote shard's bytes are cached under (an
    index derived from them is filed under it), ``None`` for a local file."""

    def __init__(
        self,
        where: str,
        entry: ShardEntry | None,
        paths: dict[str, str] | None = None,
        remote: RemoteShards | None = None,
        j: int = 0,
        roles: tuple[str, ...] = (),
    ) -> None:
        self.where, self.entry = where, entry
        self._paths, self._remote, self._j = paths or {}, remote, j
        self._roles = tuple(r for r in roles if entry is not None and r in entry.files)
        self.identity = None if remote is None else remote.identity(j)

    @property
    def size(self) -> int | None:
        """The data file's bytes as the manifest records them (``None``: not recorded)."""
        return None if self.entry is None else self.entry.bytes

    def has(self, role: str) -> bool:
        return role in (self._roles if self._remote is not None else self._paths)

    def path(self, role: str = "data") -> str | None:
        """The local file of ``role`` (a remote shard's: held until :meth:`let_go`)."""
        if self._remote is None:
            return self._paths.get(role)
        if role not in self._roles:
            return None
        return self._remote.hold(self._j)[self._roles.index(role)]

    def location(self, role: str) -> str | None:
        """Where the file of ``role`` is, for messages (a URL without credentials)."""
        if self._remote is None:
            return self._paths.get(role)
        return self._remote.location(self._j, self._roles.index(role)) if self.has(role) else None

    def read(self, role: str, limit: int) -> bytes:
        """At most ``limit`` bytes of the (small) file of ``role``; a remote one is fetched
        alone into the cache, not with the shard's other files."""
        if self._remote is None:
            with open(self._paths[role], "rb") as f:
                return f.read(limit)
        shards, j, k = self._remote, self._j, self._roles.index(role)
        what = f"shard {j} ({shards.entries[j][k].name})"
        with shards.files.fetch(shards.url(j, k), what=what) as pin, open(pin.path, "rb") as f:
            return f.read(limit)

    def let_go(self) -> None:
        if self._remote is not None:
            self._remote.release(self._j)


class ShardedReader(ReadsRemoteShards, Reader):
    """A set of shards of one format; see the module docstring. ``options`` go to the
    format's ``plan``; ``sibling``: where a bare shard's manifest is looked for
    (:func:`~stoker.formats.opening.open_set`). ``_config["roles"]``: the files of a shard
    that are read (every role of the format; a subclass may read fewer)."""

    #: Files per shard the shard cache reserves markers for (``None``: the most a shard has).
    marks: int | None = None
    #: Whether a set of 0 records opens (else a :class:`StokerFormatError`).
    empty_ok = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        format: str,
        remote: RemoteOptions | None = None,
        sibling: bool | str = True,
        **options: Any,
    ) -> None:
        if remote is not None and not isinstance(remote, RemoteOptions):
            raise TypeError(f"remote must be a RemoteOptions, got {type(remote).__name__}")
        fmt = FORMATS[format]  # the shard class by name: a worker imports its module first
        config: dict[str, Any] = {"path": os.fspath(path), "format": format, "remote": remote}
        config.update(shard=fmt.open_shard, roles=tuple(fmt.roles))
        self._reopen({**config, "sibling": sibling, "options": options}, None)
        self._ensure()

    def _reopen(self, config: dict[str, Any], opened: RemoteShards | None) -> None:
        self._config, self._opened = config, opened
        self.path, self.format = config["path"], config["format"]
        self._ready = False
        self._remote = None
        self._shards: list[Shard | None] = []
        self._open = OpenShards(MAX_OPEN_SHARDS)
        self._kept = OpenShards(MAX_KEPT_SHARDS)
        self._keys: np.ndarray | None = None
        self._labels: np.ndarray | None = None
        self._schema: Schema | None = None

    # ------------------------------------------------------------------ opening
    def _ensure(self) -> None:
        if self._ready:
            return
        c = self._config
        module, _, name = c["shard"].partition(":")
        self._cls = getattr(importlib.import_module(module), name)
        src = open_set(
            self.path,
            self.format,
            remote=c["remote"],
            opened=self._opened,
            sibling=c["sibling"],
            roles=c["roles"],
            marks=self.marks,
        )
        where = str(src.manifest_path or src.path)
        m = src.manifest  # with the shards read (a bare shard's sibling manifest: one)
        if m is not None and len(src.entries) != len(m["shards"]):
            m = {**m, "shards": src.entries}
        self._where, self.manifest, self.manifest_path = where, m, src.manifest_path
        self._class_names = src.class_names
        self.plan: SetPlan = self._cls.plan(src.manifest, where, **c["options"])
        roles = self.plan.roles
        if src.manifest is not None and not src.entries and not self.empty_ok:
            raise ManifestError(f"{where}: the manifest lists no shards")
        self._remote = remote = src.remote
        if remote is not None:
            remote.on_release = self._released
            self._files = [
                ShardFiles(remote.location(j), s, remote=remote, j=j, roles=c["roles"])
                for j, s in enumerate(src.entries)
            ]
        elif src.manifest is not None:
            mp = str(src.manifest_path)
            self._files = []
            for s in src.entries:
                check_entry(mp, s, roles, self.plan.extra.get("hint", ""))
                paths = {r: str(shard_file(mp, s, r)) for r in roles if r in s.files}
                self._files.append(ShardFiles(paths["data"], s, paths))
        else:
            self._files = [ShardFiles(src.path, None, {"data": src.path})]
        self._shards = [None] * len(self._files)
        self._ready = True
        try:
            self._set = self._positions(src)
        except BaseException:
            self.close()
            raise
        if len(self._set) == 0 and not self.empty_ok:
            raise StokerFormatError(f"{self.path}: the data set has 0 records")

    def _positions(self, src: Opened) -> ShardSet:
        """The set's positions: the manifest's record counts, or a bare shard's records."""
        return ShardSet([len(self.shard(0))]) if src.manifest is None else ShardSet(src.entries)

    def shard(self, j: int) -> Shard:
        """Shard ``j``, opened on first use and marked used: the least recently used beyond
        ``MAX_OPEN_SHARDS`` are closed, beyond :data:`MAX_KEPT_SHARDS` forgotten too."""
        sh = self._shards[j]
        if sh is None:
            files = self._files[j]
            sh = self._cls(files, self.plan)
            e = files.entry
            if e is not None and len(sh) != e.records:
                sh.close()
                raise ManifestError(
                    f"{self._where}: {files.where} has {len(sh)} records, the manifest says "
                    f"{e.records}"
                )
            self._shards[j] = sh
        for old in self._open.use(j):
            if (shard := self._shards[old]) is not None:
                shard.close()
        for old in self._kept.use(j):  # forgotten: its index is read again when it is
            shard, self._shards[old] = self._shards[old], None  # next used, and a reader
            self._open.pop(old)  # made before asks for it again
            if shard is not None:
                shard.close()
        return sh

    def _released(self, j: int) -> None:
        """A remote set lets go of shard ``j``: its shard closes first."""
        self._open.pop(j)
        sh = self._shards[j]
        if sh is not None:
            sh.close()

    def _shard_set(self) -> ShardSet:
        self._ensure()
        return self._set

    def _all(self) -> list[Shard]:
        self._ensure()
        return [self.shard(j) for j in range(len(self._shards))]

    def close(self) -> None:
        for sh in self._shards:
            if sh is not None:
                sh.close()
        self._open.clear()
        if self._remote is not None:
            self._remote.close()

    def __repr__(self) -> str:
        n = len(self) if self._ready else "?"
        return f"{type(self).__name__}({self.path!r}, {n} records)"

    # ------------------------------------------------------------------ the set
    def __len__(self) -> int:
        return len(self._shard_set())

    def keys(self) -> np.ndarray:
        if self._keys is None:
            self._keys = self._stored_keys()
            self._keys.setflags(write=False)
        return self._keys

    def _stored_keys(self) -> np.ndarray:
        n = len(self)
        if self.plan.keyed is False:
            return np.arange(n, dtype=np.int64)
        shards = self._all()
        parts = [sh.keys() for sh in shards]
        if any(p is None for p in parts):
            return np.arange(n, dtype=np.int64)
        keys = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts if p is not None])
        firsts = np.unique(keys, return_index=True)[1]
        if firsts.shape[0] != n:  # the first record whose key an earlier one holds
            i = int(np.setdiff1d(np.arange(n), firsts)[0])
            j, r = self._set.locate(i)
            key = int(keys[i])
            why = (
                f"record {r}: key {key} ({self.plan.keys_from}) is an earlier record's; keys "
                "must be unique in a set"
            )
            raise CorruptRecordError(shards[j].path, shards[j].where(r)[0], why, key=key)
        return keys

    def labels(self) -> np.ndarray:
        if self._labels is None:
            shards = self._all()
            parts = [sh.labels() for sh in shards]
            have = [p is not None for sh, p in zip(shards, parts, strict=True) if len(sh)]
            if any(have) and not all(have):
                bad = next(sh for sh, p in zip(shards, parts, strict=True) if p is None and len(sh))
                raise CorruptRecordError(
                    bad.path, None, "this shard has no labels while others of the set have them"
                )
            if not any(have):
                lab = np.zeros(len(self), dtype=np.int64)
            else:
                lab = np.concatenate([p for p in parts if p is not None and len(p)])
            lab.setflags(write=False)
            self._labels = lab
        return self._labels

    def label_kind(self) -> tuple[tuple[int, ...], str]:
        self._ensure()
        known = self.plan.label_kind
        return known if known is not None else super().label_kind()

    @property
    def schema(self) -> Schema:
        if self._schema is None:
            self._ensure()
            self._schema = self.plan.schema or _agreed([sh for sh in self._all() if len(sh)])
        return self._schema

    @property
    def class_names(self) -> list[str] | None:
        self._ensure()
        return self._class_names

    def files(self) -> list[str]:
        """The shards' files, in position order (a set in object storage: their URLs)."""
        self._ensure()
        return [
            p
            for f in self._files
            for role in self._config["roles"]
            if (p := f.location(role)) is not None
        ]

    def shard_sizes(self) -> np.ndarray:
        return self._shard_set().shard_sizes()

    def block_sizes(self) -> np.ndarray | None:
        """Records per block where some shard declares blocks (one without is one block)."""
        self._ensure()
        if not self.plan.blocks:  # no shard is opened for blocks it cannot have
            return None
        firsts = [(s, sh.blocks) for s, sh in zip(self._set.starts, self._all()) if len(sh)]
        if all(b is None for _, b in firsts):
            return None
        cuts = [s + np.asarray([0] if b is None else b, np.int64) for s, b in firsts]
        return np.diff(np.unique(np.concatenate([*cuts, [len(self)]])))

    def where(self, i: int) -> tuple[int, int]:
        """``(shard, record inside it)`` of position ``i``."""
        return self._shard_set().locate(i, self.path)

    def locate(self, i: int) -> tuple[str, int]:
        j, r = self.where(i)
        return self._files[j].where, self.shard(j).where(r)[0]

    def describe(self, i: int) -> str:
        j, r = self.where(i)
        off, name = self.shard(j).where(r)
        return f"{name} (position {i}) at byte offset {off} of {self._files[j].where}"

    def summary(self) -> dict:
        """Shards and bytes (as the manifest records them, or the bare file's size)."""
        self._ensure()
        sizes = [f.size if f.size is not None else os.path.getsize(f.where) for f in self._files]
        return {"shards": len(self._files), "bytes": int(sum(sizes))}

    def fingerprint(self) -> dict:
        sha = digest([np.ascontiguousarray(self.keys(), dtype="<i8"), self.labels()])
        return {"format": self.format, "records": len(self), "sha256": sha}

    # ------------------------------------------------------------------ reading
    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()) -> ReadSample:
        """``f(i) -> (image, label, key, {field: value})``; see :class:`Reader`."""
        schema = self.schema
        stored = schema.stored
        names = []
        for n in fields:
            if n in stored:
                names.append(n)
            elif n != SIZE_FIELD and (n not in schema or schema[n].kind != "size"):
                raise SpecError(f"{self.path}: no stored field {n!r}; it has {list(schema.extra)}")
        asked = tuple(names)
        self._focus(indices)  # a remote set holds only the shards this chunk reads
        keys, starts, locate = self.keys(), self._set.starts, self._set.locate
        rows: dict[int, np.ndarray] = {}
        if indices is not None:
            pos = np.asarray(indices, dtype=np.int64).reshape(-1)
            pos = pos[(pos >= 0) & (pos < len(keys))]
            of = self._set.shard_of(pos)
            for j in np.unique(of).tolist():
                rows[j] = pos[of == j] - starts[j]
        got: dict[int, Any] = {}
        use, shard = self._open.get, self.shard

        def read(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            j, r = locate(i, self.path)
            f = got.get(j)
            if f is None or j not in self._open:
                f = got[j] = shard(j).reader(rows.get(j), asked)
            else:
                use(j)
            key = int(keys[i])
            image, label, out = f(r, key)
            return image, label, key, out

        return read


def _agreed(shards: list[Shard]) -> Schema:
    """The schema every shard has (each variable field's longest value over them all);
    :class:`StokerFormatError` naming a shard whose fields differ from the first's."""
    first = shards[0].schema
    lengths: dict[str, int] = {}

    def bare(s: Schema) -> Schema:
        return Schema(tuple((n, replace(f, max_len=None)) for n, f in s.items()))

    for sh in shards:
        s = sh.schema
        if bare(s) != bare(first):
            raise StokerFormatError(
                f"{sh.path}: its records hold other fields than {shards[0].path} ({list(s)} vs "
                f"{list(first)})"
            )
        for n in s:
            if s[n].max_len is not None:
                lengths[n] = max(lengths.get(n, 0), int(s[n].max_len or 0))
    return first.with_max_len(lengths)
