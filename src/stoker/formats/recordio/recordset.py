"""A RecordIO set read as one (:class:`RecordSet`): a ``.rec`` (or its ``.idx``), or the shards
a ``NAME.stoker.json`` lists, each checked against its entry.

Global positions ``0..N-1`` run through the shards in manifest order; a shard is opened by
:func:`open_shard`, which refuses a ``.rec`` or ``.idx`` that no longer matches what the
manifest recorded when the shard was written. A set of one shard (a bare ``.rec``, or a
manifest of one) is opened at once, and insightface's layout recognised in it
(``insightface.py``; a malformed layout is a ``CorruptRecordError`` at open). A URL other than
``file://`` names a manifest read through the node's shard cache (``remote``: its options).
``verify_checksums``: ``True`` requires the ``.crc32c``, ``"auto"`` checks it where it exists
(a ``.crc32c`` a manifest names must exist), ``False`` ignores it.

Shards are opened lazily, when a record of theirs is first read, and at most
:data:`MAX_OPEN_SHARDS` of them stay open per ``RecordSet`` (least recently used closed
first): an open shard holds one file descriptor and two memory maps (the ``.rec`` and the
binary index cache), so a set of 100,000 shards read by 8 workers stays within the default
``ulimit -n`` (1024) and ``vm.max_map_count`` (65530).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError, ManifestError
from stoker._core.schema import Schema
from stoker.formats.opening import check_entry, open_remote, open_set
from stoker.formats.recordio.header import IRHeader
from stoker.formats.recordio.index import sha256_file
from stoker.formats.recordio.insightface import Layout, detect_layout
from stoker.formats.recordio.manifest import (
    KIND,
    MANIFEST_SUFFIX,
    class_names,
    manifest_schema,
    shard_paths,
)
from stoker.formats.recordio.paths import default_crc_path, manifest_path_for
from stoker.formats.recordio.reader import Checksums, PlainRead, RecordFile
from stoker.formats.remote import (
    RemoteFiles,
    RemoteOptions,
    local_path,
    redact,
    remote_url,
)
from stoker.formats.shardfiles import RemoteShards, Reopens
from stoker.formats.shards import MAX_OPEN_SHARDS, OpenShards, ShardEntry, ShardSet

__all__ = [
    "MAX_OPEN_SHARDS",
    "RecordSet",
    "open_shard",
    "precheck_shards",
]


def _checked(
    where: str, shard: ShardEntry, rec: str, idx: str, crc: str | None, **kw: Any
) -> RecordFile:
    """The ``RecordFile`` of a shard's files (``kw``: its options), checked against its entry
    (``where``: the manifest, for messages): closed and :class:`ManifestError` when they
    differ. ``verify_checksums="auto"`` checks the ``.crc32c`` the entry names and no other."""
    if kw.get("verify_checksums") == "auto" and crc is None:
        kw = {**kw, "verify_checksums": False}  # the manifest says there is none
    r = RecordFile(rec, idx, crc_path=crc, **kw)
    try:
        size = os.path.getsize(r.path)
        if size != shard.bytes:
            raise ManifestError(
                f"{where}: {r.path} is {size} bytes but the manifest records "
                f"{shard.bytes}; the .rec was replaced or truncated"
            )
        sha = r.idx_sha256
        if sha is None and r.idx_path is not None:
            sha = sha256_file(r.idx_path)
        if sha != shard.checksums.get("index.sha256"):
            raise ManifestError(
                f"{where}: idx does not match rec: the sha256 of {r.idx_path} differs "
                "from the one recorded when the shard was written"
            )
        if len(r) != shard.records:
            raise ManifestError(
                f"{where}: {r.path} has {len(r)} records, the manifest says {shard.records}"
            )
    except BaseException:
        r.close()
        raise
    return r


def open_shard(manifest_path: str, shard: ShardEntry, **kw: Any) -> RecordFile:
    """The ``RecordFile`` of one ``shards[]`` entry of the manifest at ``manifest_path``
    (``kw``: its options); :class:`ManifestError` when the files differ from the entry (a
    ``.crc32c`` the entry names must exist)."""
    check_entry(manifest_path, shard, ("data", "index"))
    rec, idx, crc = shard_paths(manifest_path, shard)
    return _checked(manifest_path, shard, rec, idx, crc, **kw)


def open_remote_shard(remote: RemoteShards, shard: ShardEntry, j: int, **kw: Any) -> RecordFile:
    """The ``RecordFile`` of shard ``j`` of a remote set, read from the pinned cached copies
    ``remote`` holds (let go of again when the shard does not match its entry)."""
    paths = remote.hold(j)
    try:
        crc = paths[2] if len(paths) > 2 else None
        return _checked(redact(remote.files.url), shard, paths[0], paths[1], crc, **kw)
    except BaseException:
        remote.release(j)
        raise


#: How to read a set whose manifest names a checksum file that is gone.
_NO_CRC = (
    "; open with verify_checksums=False (RecordSource(path, checksums=False)) to read "
    "without checksums"
)


def precheck_shards(manifest_path: str, manifest: dict, checksums: Checksums) -> None:
    """What can be checked of every shard without opening it (:func:`~stoker.formats.opening.
    check_entry`): its ``.idx`` is there, its ``.rec`` has the size the manifest records, a
    ``.crc32c`` it names exists (unless checksums are off) and holds one uint32 per record.
    The ``.idx`` is checked against its sha256 when the shard is first opened."""
    roles = ("index", "data", "crc") if checksums else ("index", "data")
    for shard in manifest["shards"]:
        check_entry(manifest_path, shard, roles, _NO_CRC)


class _Shards(Sequence[RecordFile]):
    """``RecordSet.shards``: each shard's reader, opened when it is asked for (through the
    set's bounded cache of open shards)."""

    def __init__(self, owner: RecordSet) -> None:
        self._owner = owner

    def __len__(self) -> int:
        return len(self._owner._entries)

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return [self._owner.shard(k) for k in range(len(self))[j]]
        return self._owner.shard(j)

    def __iter__(self) -> Iterator[RecordFile]:
        for j in range(len(self)):
            yield self._owner.shard(j)


class RecordSet(Reopens):
    """A RecordIO set read as one (see the module docstring): global positions ``0..N-1``
    run through the shards in manifest order. ``key(i)`` is the key inside its shard;
    ``locate(i)`` names the shard (keys of different shards may repeat).

    ``images=True`` reads the image records of an insightface set alone (positions
    ``0..M-1`` mapped to ``image_positions``); :meth:`images` gives that view of an open set.
    A context manager: ``close`` on exit. Pickles as its configuration and reopens."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify_checksums: Checksums = False,
        cache: bool = True,
        remote: RemoteOptions | None = None,
        files: RemoteFiles | None = None,
        max_open: int | None = None,
        whole: bool | None = None,
        images: bool = False,
    ) -> None:
        config = {
            "path": os.fspath(path),
            "verify_checksums": verify_checksums,
            "cache": cache,
            "remote": remote,
            "files": files,
            "max_open": max_open,  # what a loader's claim on the cache allows
            "whole": whole,
            "images": images,
        }
        self._reopen(config, None)

    def _reopen(self, config: dict[str, Any], opened: RemoteShards | None) -> None:
        self._config = config
        self.verify_checksums = config["verify_checksums"]
        self._cache = config["cache"]
        self._opened = opened
        self._remote: RemoteShards | None = None
        self._open_shards: OpenShards[RecordFile] = OpenShards(MAX_OPEN_SHARDS)
        self._bare: RecordFile | None = None
        self._keys: np.ndarray | None = None
        self._layout: Layout | None = None
        self._pos: np.ndarray | None = None
        p, files = config["path"], config["files"]
        url = remote_url(p) if files is None else files.url
        if url is not None:
            if not url.endswith(MANIFEST_SUFFIX):
                raise ValueError(
                    f"{redact(url)}: a RecordIO set in object storage is opened by its "
                    f"manifest (NAME{MANIFEST_SUFFIX}, which `stoker pack` writes beside "
                    "the shards)"
                )
            self.files = config["files"] = files or RemoteFiles(url, config["remote"])
            self.manifest_path: str | None = redact(url)
            manifest = self._open_remote(self.files)
            self._set_manifest(manifest, manifest["shards"])
            return
        self.files = None
        self._open_local(local_path(p))

    def _set_manifest(self, manifest: dict | None, entries: list[ShardEntry | None]) -> None:
        self.manifest = manifest
        self.class_names = class_names(manifest) if manifest is not None else None
        self._entries = entries

    def _open_local(self, p: str) -> None:
        """A ``.rec``, its ``.idx`` or a manifest: every shard the manifest lists (a bare
        ``.rec`` the manifest beside it lists is that one shard), else the bare file."""
        idx: str | None = None
        if p.endswith(".idx"):
            rec = p[:-4] + ".rec"
            if not os.path.exists(rec):
                raise FileNotFoundError(f"{p}: no {os.path.basename(rec)} beside it")
            idx, p = p, rec
        src = open_set(p, KIND, sibling=manifest_path_for(p))
        self.manifest_path = None if src.manifest is None else str(src.manifest_path)
        if src.manifest is not None:
            precheck_shards(str(src.manifest_path), {"shards": src.entries}, self.verify_checksums)
            self._set_manifest(src.manifest, [*src.manifest["shards"]])
            if len(src.entries) == 1:  # a bare .rec of a set: that shard alone
                self._entries = [*src.entries]
            self._set = ShardSet(self._entries)  # type: ignore[arg-type]
        else:
            self._set_manifest(None, [None])
            crc = default_crc_path(p)
            self._bare = RecordFile(
                p,
                idx,
                crc_path=crc if os.path.exists(crc) else None,
                verify_checksums=self.verify_checksums,
                cache=self._cache,
            )
            self._set = ShardSet([len(self._bare)])
        self._starts = self._set.starts
        if len(self._entries) == 1:  # opened now: its files checked, its layout recognised
            first = self.shard(0)
            try:
                self._layout = detect_layout(first)
            except BaseException:
                self.close()
                raise
            if self._layout is not None and self._config["images"]:
                self._pos = self._layout.image_positions

    def _open_remote(self, files: RemoteFiles) -> dict:
        """The manifest of a set in object storage, checked (each file listed with its size,
        the cache's room), and its opener (:class:`RemoteShards`); as another process opened
        it when this one was unpickled (nothing listed again)."""
        c = self._config
        self._remote, manifest = open_remote(
            files,
            KIND,
            self._opened,
            ("data", "index", "crc") if self.verify_checksums else ("data", "index"),
            max_open=c["max_open"],
            whole=c["whole"],
            marks=3,
        )
        self._remote.on_release = self._released
        self._set = ShardSet(manifest["shards"])
        self._starts = self._set.starts
        return manifest

    def _released(self, j: int) -> None:
        """The opener lets go of shard ``j`` (room, focus, a claim's cap): forget its reader,
        which stays usable to whoever still holds it (unmapped once nobody does)."""
        self._open_shards.pop(j)

    def __enter__(self) -> RecordSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def remote(self) -> RemoteShards | None:
        """The files of a set in object storage and the cache they are read through."""
        return self._remote

    def shard(self, j: int) -> RecordFile:
        """The reader of shard ``j`` (opened and checked on first use; cached)."""
        if self._bare is not None:
            return self._bare
        got = self._open_shards.get(j)
        if got is not None:
            return got
        entries = self._entries
        if not -len(entries) <= j < len(entries):
            raise IndexError(f"shard {j} out of range for {len(entries)} shards")
        j %= len(entries)
        kw = {"verify_checksums": self.verify_checksums, "cache": self._cache}
        entry = entries[j]
        assert entry is not None  # only a bare file has no entry
        if self._remote is None:
            r = open_shard(str(self.manifest_path), entry, **kw)
        else:  # the opener makes room first: a reader never waits for its own pins
            r = open_remote_shard(self._remote, entry, j, **kw)
        # the shard reads its records as the set's manifest declares them (a field trailer)
        r.manifest, r.class_names = self.manifest, self.class_names
        self._open_shards.limit = MAX_OPEN_SHARDS if self._remote is None else self._remote.max_open
        for old, _ in self._open_shards.use(j, r):
            self._drop(old, close=False)  # forgotten already; a remote one's pins go
        return r

    def _drop(self, j: int, *, close: bool = True) -> None:
        """Forget open shard ``j`` and let the opener release its pins. ``close=False`` leaves
        the reader to whoever still holds it (a local shard dropped from the LRU: unmapped
        once nobody holds it or a view of its records)."""
        r = self._open_shards.pop(j)
        try:
            if r is not None and close:
                r.close()
        finally:
            if self._remote is not None:
                self._remote.release(j)

    def shard_location(self, j: int) -> str:
        """Where shard ``j``'s ``.rec`` lives, for messages: a local path or a URL."""
        if self._remote is not None:
            return self._remote.location(j)
        entry = self._entries[j]
        if entry is None:
            return self.shard(j).path
        return shard_paths(str(self.manifest_path), entry)[0]

    def shard_sizes(self) -> np.ndarray:
        """Records per shard (the image records of an insightface set: one shard)."""
        return self._set.shard_sizes() if self._pos is None else np.array([len(self)], np.int64)

    def chunks(self, positions: np.ndarray) -> Iterator[tuple[RecordFile, np.ndarray]]:
        """The positions of a chunk (in range) grouped by the ``.rec`` that holds them, as
        ``(shard reader, positions inside that shard)``."""
        pos = np.asarray(positions, dtype=np.int64).reshape(-1)
        pos = pos[(pos >= 0) & (pos < len(self))]
        if self._pos is not None:
            pos = self._pos[pos]
        which = self._set.shard_of(pos)
        for j in np.unique(which).tolist():
            yield self.shard(j), pos[which == j] - self._starts[j]

    @property
    def shards(self) -> Sequence[RecordFile]:
        """The shards' readers, in manifest order (opened as they are asked for)."""
        return _Shards(self)

    def __len__(self) -> int:
        return len(self._set) if self._pos is None else int(self._pos.shape[0])

    def __repr__(self) -> str:
        where = self.manifest_path or self._config["path"]
        return f"RecordSet({where!r}, {len(self._entries)} shards, {len(self)} records)"

    def close(self) -> None:
        if self._bare is not None:
            self._bare.close()
        while self._open_shards:
            self._drop(self._open_shards.oldest())
        if self._remote is not None:
            self._remote.close()

    def images(self) -> RecordSet:
        """The image records alone: ``self`` unless the set has insightface's layout; else a
        view over the same open files (closing either closes both)."""
        if self._layout is None or self._pos is not None:
            return self
        view = RecordSet.__new__(RecordSet)
        view.__dict__.update(self.__dict__)
        view._config = {**self._config, "images": True}
        view._pos, view._keys = self._layout.image_positions, None
        return view

    @property
    def identity_ranges(self) -> np.ndarray | None:
        """insightface layout: int64 ``(n_identities, 2)`` ``[start_key, end_key)``; else None."""
        return None if self._layout is None else self._layout.ranges

    @property
    def image_keys(self) -> np.ndarray | None:
        """insightface layout: the keys that are images; else None."""
        return None if self._layout is None else self._layout.image_keys

    @property
    def image_positions(self) -> np.ndarray | None:
        """insightface layout: the (file) positions of the image records; else None."""
        return None if self._layout is None else self._layout.image_positions

    @property
    def schema(self) -> Schema:
        """The schema the manifest declares; else an image and its IRHeader label(s), float32
        of the first record's label count (what every set packed without fields is)."""
        declared = manifest_schema(self.manifest) if self.manifest else None
        if declared is None and len(self._entries):
            return self.shard(0).schema
        return declared or Schema.classification((), "float32")

    def locate(self, i: int) -> tuple[int, int]:
        """``(shard index, position inside that shard)`` of position ``i``."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record position {i} out of range for {n} records")
        i = i + n if i < 0 else i
        return (0, int(self._pos[i])) if self._pos is not None else self._set.locate(i)

    @property
    def keys(self) -> np.ndarray:
        """int64 keys in position order."""
        if self._keys is None:
            parts = []
            for j in range(len(self._entries)):
                was_open = j in self._open_shards
                try:
                    parts.append(np.array(self.shard(j).keys, dtype=np.int64))
                finally:  # a remote set pins one shard at a time for its keys
                    if self._remote is not None and not was_open and not self._remote.whole:
                        self._drop(j)
            keys = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
            self._keys = keys if self._pos is None else keys[self._pos]
        return self._keys

    def key(self, i: int) -> int:
        j, k = self.locate(i)
        return self.shard(j).key(k)

    def offset(self, i: int) -> int:
        j, k = self.locate(i)
        return self.shard(j).offset(k)

    def read(self, i: int) -> memoryview:
        """Position ``i``'s whole payload, valid until ``close``."""
        j, k = self.locate(i)
        return self.shard(j).read(k)

    def read_header(self, i: int) -> tuple[IRHeader, memoryview]:
        """``(IRHeader, image bytes)`` of position ``i`` (never the field trailer)."""
        j, k = self.locate(i)
        return self.shard(j).read_header(k)

    def read_fields(
        self, i: int, names: Sequence[str] | None = None
    ) -> tuple[IRHeader, memoryview, dict[str, Any]]:
        """``(IRHeader, image bytes, fields)``: the stored fields ``names`` (all when ``None``)
        of position ``i``, each as ``Field.check`` gives it (a mask as its PNG bytes)."""
        j, k = self.locate(i)
        return self.shard(j).read_fields(k, names)

    def plain_reader(self, positions: Sequence[int] | np.ndarray | None = None) -> PlainRead | None:
        """``RecordFile.plain_reader`` of a local set of one shard (over the image positions
        of an insightface set); ``None`` for a set of several shards or in object storage."""
        if len(self._entries) != 1 or self._remote is not None:
            return None
        if self._pos is None:
            return self.shard(0).plain_reader(positions)
        pos, n = self._pos, int(self._pos.shape[0])
        known: dict[int, int] = {}
        parent_positions = None
        if positions is not None:
            mine = np.asarray(positions, dtype=np.int64).reshape(-1)
            mine = mine[(mine >= 0) & (mine < n)]
            parent_positions = pos[mine]
            known = dict(zip(mine.tolist(), parent_positions.tolist(), strict=True))
        read = self.shard(0).plain_reader(parent_positions)
        if read is None:
            return None

        def image(i: int) -> tuple[float, memoryview, int] | None:
            j = known.get(i)
            if j is None:
                if not 0 <= i < n:
                    return None
                j = int(pos[i])
            return read(j)

        return image

    def labels(self, positions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
        """float32 labels of all records (or of ``positions``) without decoding images."""
        n = len(self)
        pos = (
            np.arange(n, dtype=np.int64)
            if positions is None
            else np.asarray(positions, dtype=np.int64).reshape(-1)
        )
        if pos.size and (pos.min() < -n or pos.max() >= n):
            raise IndexError(f"positions out of range for {n} records")
        pos = np.where(pos < 0, pos + n, pos)
        if pos.size == 0:
            return np.zeros(0, dtype=np.float32)
        if self._pos is not None:
            mapped = self._pos[pos]
            if positions is None and bool(np.all(mapped[1:] - mapped[:-1] == 1)):
                return self.shard(0).labels_span(int(mapped[0]), n)  # as face2rec writes them
            return self.shard(0).labels(mapped)
        if positions is None and len(self._entries) == 1 and self._remote is None:
            return self.shard(0).labels()  # through the label cache
        shard = self._set.shard_of(pos)
        pieces: list[tuple[np.ndarray, np.ndarray]] = []
        for j in np.unique(shard).tolist():
            sel = np.flatnonzero(shard == j)
            was_open = j in self._open_shards
            try:
                lab = self.shard(j).labels(pos[sel] - self._starts[j])
            finally:  # a remote set pins one shard at a time for its labels
                if self._remote is not None and not was_open and not self._remote.whole:
                    self._drop(j)
            if pieces and lab.shape[1:] != pieces[0][1].shape[1:]:
                raise self._mixed_labels(j, int(pos[sel[0]] - self._starts[j]), pieces, lab)
            pieces.append((sel, lab))
        out = np.empty((pos.shape[0], *pieces[0][1].shape[1:]), dtype=np.float32)
        for sel, lab in pieces:
            out[sel] = lab
        return out

    def _mixed_labels(
        self, j: int, k: int, pieces: list[tuple[np.ndarray, np.ndarray]], lab: np.ndarray
    ) -> CorruptRecordError:
        """The error for shards whose records carry different label counts: it names the
        first record of shard ``j`` read (position ``k`` inside it)."""
        r = self.shard(j)

        def count(a: np.ndarray) -> int:
            return int(a.shape[1]) if a.ndim == 2 else 0

        return CorruptRecordError(
            r.path,
            r.offset(k),
            f"records carry different label counts: this shard's have {count(lab)} "
            f"(IRHeader flag), earlier shards' {count(pieces[0][1])} (manifest "
            f"{self.manifest_path})",
            key=r.key(k),
            idx_line=r.idx_line(k),
        )
