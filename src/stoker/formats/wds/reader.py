"""The :class:`~stoker.formats.Reader` of WebDataset tar shards: one ``.tar``, or the shards a
stoker-written ``NAME.stoker.json`` (``"kind": "wds"``) lists, read as one set.

Positions ``0..N-1`` run through the shards in manifest order. WebDataset keys are strings, so
the reader's int keys are the positions; ``key_name(i)`` gives the member key and
``describe(i)`` the tar, the key and the byte offset of the sample's first header.

The schema is the manifest's (``Schema.classification()`` when it declares none); a tar
without a manifest has an image, its ``cls`` label, and text fields ``txt`` and ``json`` when
any sample holds such a member (``layout``). Labels: the ``.cls`` values, or 0 for every sample
of a set without any ``.cls``.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError, ManifestError, SpecError
from stoker._core.schema import SIZE_FIELD, Schema
from stoker.formats.base import Reader, ReadSample
from stoker.formats.manifest import manifest_schema, shard_file
from stoker.formats.opening import check_entry, open_set
from stoker.formats.remote import RemoteOptions
from stoker.formats.shardfiles import ReadsRemoteShards
from stoker.formats.shards import MAX_OPEN_SHARDS, OpenShards, ShardEntry, ShardSet, digest
from stoker.formats.wds.layout import (
    IMAGE_SUFFIXES,
    LABEL_SUFFIX,
    RAW_FIELDS,
    field_suffixes,
    raw_schema,
)
from stoker.formats.wds.remote import RemoteTar
from stoker.formats.wds.shard import Shard, check_uncompressed, decode_field

__all__ = ["MAX_OPEN_SHARDS", "WdsReader", "open_reader"]


def open_reader(
    path: str | os.PathLike[str], *, cache: bool = True, remote: RemoteOptions | None = None
) -> WdsReader:
    """The reader of a ``.tar`` or a stoker-wds manifest (``cache=False``: no index cache;
    ``remote``: how to reach and cache a manifest's URL)."""
    return WdsReader(path, cache=cache, remote=remote)


class WdsReader(ReadsRemoteShards, Reader):
    """WebDataset shards with random access; see the module docstring. ``path`` may be a
    manifest's URL (``remote``: how to reach and cache it): each tar is read from a pinned
    copy in the node's shard cache (``docs/remote.md``)."""

    format = "wds"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        cache: bool = True,
        remote: RemoteOptions | None = None,
    ) -> None:
        self._reopen({"path": os.fspath(path), "cache": bool(cache), "remote": remote}, None)

    def _reopen(self, config: dict[str, Any], opened: Any) -> None:
        self._config = config
        path, cache = config["path"], config["cache"]
        self.path, self._cache, self._options = path, cache, config["remote"]
        self._remote = None
        self.manifest: dict | None = None
        self._shards: list[Shard] = []
        self._class_names: list[str] | None = None
        self._declared: Schema | None = None
        self._set: ShardSet | None = None
        self._schema: Schema | None = None
        self._suffixes: dict[str, str] | None = None
        self._mapped: OpenShards[None] = OpenShards(MAX_OPEN_SHARDS)
        src = open_set(path, self.format, remote=self._options, opened=opened)
        m, where = src.manifest, str(src.manifest_path)
        if m is None:
            if os.path.isfile(src.path):
                with open(src.path, "rb") as f:
                    check_uncompressed(src.path, f.read(8))
            self._shards = [Shard(src.path, cache=cache)]
            return
        # a manifest, or a stoker shard read as its manifest declares it (fields, classes)
        self.manifest = m if len(src.entries) == len(m["shards"]) else {**m, "shards": src.entries}
        self._declared = manifest_schema(m, where)
        self._class_names = src.class_names
        if (remote := src.remote) is None:
            self._shards = [self._manifest_shard(where, s) for s in src.entries]
        else:
            self._remote, remote.on_release = remote, self._released
            self._shards = [
                RemoteTar(remote, j, s, manifest=where, cache=cache)
                for j, s in enumerate(src.entries)
            ]
        if not self._shards:
            raise ManifestError(f"{where}: the manifest lists no shards")

    def _released(self, j: int) -> None:
        """A remote set lets go of shard ``j``: unmap it first."""
        self._mapped.pop(j)
        self._shards[j].close()

    def _shard_set(self) -> ShardSet:
        return self.shard_set

    def files(self) -> list[str]:
        """The tar files, in position order (a set in object storage: their URLs)."""
        if self._remote is not None:
            return [self._remote.location(j) for j in range(len(self._remote))]
        return super().files()

    def summary(self) -> dict:
        """What ``stoker inspect`` shows of a manifest's set beyond the samples: its shards
        and their bytes (as the manifest records them, read without any shard)."""
        if self.manifest is None:
            return {}
        tars = self.manifest["shards"]
        return {"shards": len(tars), "bytes": sum(int(s.bytes or 0) for s in tars)}

    def label_kind(self) -> tuple[tuple[int, ...], str]:
        """One label's shape and dtype: an int64 each (read without any shard)."""
        return (), "int64"

    def _manifest_shard(self, manifest: str, s: ShardEntry) -> Shard:
        check_entry(manifest, s, ("data", "crc"))  # a side-car of another tar's size too
        tar, crc = str(shard_file(manifest, s, "data")), shard_file(manifest, s, "crc")
        return Shard(
            tar,
            records=s.records,
            tar_bytes=s.bytes,
            manifest=manifest,
            cache=self._cache,
            crc=crc,
        )

    # ------------------------------------------------------------------ sizes
    @property
    def shards(self) -> list[Shard]:
        return self._shards

    @property
    def shard_set(self) -> ShardSet:
        """The shards' positions (:mod:`stoker.formats.shards`): their counts from the
        manifest, or the one tar's index."""
        if self._set is None:
            if self.manifest is not None:
                counts = [s.records for s in self.manifest["shards"]]
            else:
                counts = [len(self._shards[0].index())]
            self._set = ShardSet(counts)
        return self._set

    def __len__(self) -> int:
        return len(self.shard_set)

    def shard_sizes(self) -> np.ndarray:
        """Samples per ``.tar`` shard, in manifest order (a single tar is one shard)."""
        return self.shard_set.shard_sizes()

    def _locate(self, i: int) -> tuple[int, int]:
        if i < 0:
            raise IndexError(f"sample position {i} out of range for {len(self)} samples")
        return self.shard_set.locate(i, self.path)

    def keys(self) -> np.ndarray:
        return np.arange(len(self), dtype=np.int64)

    def key(self, i: int) -> int:
        self._locate(i)
        return int(i)

    def key_name(self, i: int) -> str:
        """The WebDataset key (member name up to the first dot) of sample ``i``."""
        s, j = self._locate(i)
        return self._shards[s].index().key_name(j)

    def describe(self, i: int) -> str:
        s, j = self._locate(i)
        index = self._shards[s].index()
        return (
            f"{self._shards[s].path}: sample {index.key_name(j)!r} (position {i}), first "
            f"header at byte offset {int(index.headers[j])}"
        )

    # ------------------------------------------------------------------ schema and labels
    @property
    def schema(self) -> Schema:
        if self._schema is None:
            if self._declared is not None:
                self._schema = self._declared
            elif self.manifest is not None:
                self._schema = Schema.classification()
            else:
                index = self._shards[0].index()
                lengths = {}
                for suffix, name in RAW_FIELDS.items():
                    m = index.max_size(suffix)
                    if m is not None:
                        lengths[name] = m
                self._schema = raw_schema(lengths)
                unread = sorted(
                    f".{x}"
                    for x in index.suffixes
                    if x not in RAW_FIELDS and x != LABEL_SUFFIX and x not in IMAGE_SUFFIXES
                )
                if unread:  # fields a manifest would declare: say they are left out
                    warnings.warn(
                        f"{self.path}: members {', '.join(unread)} are not read: a tar without "
                        "a stoker manifest is read as image, .cls, .txt and .json; open the "
                        "set's NAME.stoker.json (or keep it beside the tar) to read its fields",
                        stacklevel=2,
                    )
        return self._schema

    def _suffix_map(self) -> dict[str, str]:
        if self._suffixes is None:
            schema = self.schema
            if self.manifest is None:
                self._suffixes = {n: s for s, n in RAW_FIELDS.items() if n in schema}
            else:
                self._suffixes = field_suffixes(schema)
        return self._suffixes

    @property
    def class_names(self) -> list[str] | None:
        return self._class_names

    def labels(self) -> np.ndarray:
        """int64 ``(N,)``: each sample's ``.cls`` (0 throughout a set without any)."""
        parts, with_cls = [], []
        for shard in self._shards:
            index = shard.index()
            parts.append(index.labels)
            if len(index):
                with_cls.append(bool(index.has_cls[0]))
        if any(with_cls) and not all(with_cls):
            bad = self._shards[with_cls.index(False)]
            raise CorruptRecordError(
                bad.path, None, "this shard has no .cls labels while others of the set have them"
            )
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def fingerprint(self) -> dict:
        """Format, count, and a sha256 of every shard's key names and labels."""
        parts: list[Any] = []
        for shard in self._shards:
            index = shard.index()
            parts += [len(index).to_bytes(8, "little"), index.key_offs.astype("<i8")]
            parts += [index.keys, index.labels.astype("<i8")]
        return {"format": self.format, "count": len(self), "sha256": digest(parts)}

    # ------------------------------------------------------------------ reading
    def _shard_view(self, s: int) -> memoryview:
        shard = self._shards[s]
        if len(self._shards) > 1:
            for old, _ in self._mapped.use(s):
                self._shards[old].close()
        return shard.view()

    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()) -> ReadSample:
        """``f(i) -> (image memoryview, label, position, {field: value})`` (see ``base``)."""
        self._focus(indices)  # a remote set holds only the shards this chunk reads
        schema = self.schema
        stored = schema.stored
        names = []
        for name in fields:
            if name in stored:
                names.append(name)
            elif name not in schema and name != SIZE_FIELD:
                raise SpecError(f"unknown field {name!r}; this set has {list(schema)}")
        suffixes = self._suffix_map()
        path_of = [s.path for s in self._shards]

        def read(i: int) -> tuple[Any, int, int, dict[str, Any]]:
            s, j = self._locate(i)
            view = self._shard_view(s)
            shard = self._shards[s]
            cols = shard.columns(suffixes)
            index = shard.index()
            off, size = cols[""]
            o, n = int(off[j]), int(size[j])
            check = shard.crcs()
            if check is not None:
                bad = check.problem(view, j)
                if bad is not None:
                    head = int(index.headers[j])
                    raise CorruptRecordError(
                        path_of[s], head, f"sample {index.key_name(j)!r}: {bad}", key=i
                    )
            if n <= 0:
                raise CorruptRecordError(
                    path_of[s],
                    o,
                    f"sample {index.key_name(j)!r}: its image member is empty",
                    key=i,
                )
            out: dict[str, Any] = {}
            for name in names:
                fo, fs = cols[name]
                where = (path_of[s], index.key_name(j), i)
                out[name] = decode_field(
                    view, int(fo[j]), int(fs[j]), stored[name], name, suffixes[name], where
                )
            return view[o : o + n], int(index.labels[j]), i, out

        return read

    def close(self) -> None:
        for shard in self._shards:
            shard.close()
        self._mapped.clear()
        if self._remote is not None:
            self._remote.close()
