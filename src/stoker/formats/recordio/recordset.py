"""Several shards of a manifest read as one (:class:`RecordSet`), each checked against its entry.

Global positions ``0..N-1`` run through the shards in manifest order; a shard is opened by
:func:`open_shard`, which refuses a ``.rec`` or ``.idx`` that no longer matches what the
manifest recorded when the shard was written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from stoker._core.errors import ManifestError
from stoker.formats.recordio.header import IRHeader
from stoker.formats.recordio.index import sha256_file
from stoker.formats.recordio.manifest import class_names, load_manifest, shard_paths
from stoker.formats.recordio.reader import RecordFile
from stoker.formats.recordio.records import Records

__all__ = ["RecordSet", "open_shard"]


def _check_shard(r: RecordFile, shard: dict, manifest_path: str) -> None:
    size = os.path.getsize(r.path)
    if size != shard["rec_bytes"]:
        raise ManifestError(
            f"{manifest_path}: {r.path} is {size} bytes but the manifest records "
            f"{shard['rec_bytes']}; the .rec was replaced or truncated"
        )
    sha = r.idx_sha256
    if sha is None and r.idx_path is not None:
        sha = sha256_file(r.idx_path)
    if sha != shard["idx_sha256"]:
        raise ManifestError(
            f"{manifest_path}: idx does not match rec: the sha256 of {r.idx_path} differs "
            "from the one recorded when the shard was written"
        )
    if len(r) != shard["records"]:
        raise ManifestError(
            f"{manifest_path}: {r.path} has {len(r)} records, the manifest says {shard['records']}"
        )


def open_shard(manifest_path: str, shard: dict, **kw: Any) -> RecordFile:
    """The ``RecordFile`` of one ``shards[]`` entry of the manifest at ``manifest_path``
    (``kw``: its options); :class:`ManifestError` when the files differ from the entry."""
    rec, idx, crc = shard_paths(manifest_path, shard)
    r = RecordFile(rec, idx, crc_path=crc, **kw)
    try:
        _check_shard(r, shard, manifest_path)
    except BaseException:
        r.close()
        raise
    return r


class RecordSet(Records):
    """Several shards read as one: global positions ``0..N-1`` run through the shards in
    manifest order. ``key(i)`` is the key inside its shard; ``shard_of(i)`` names the shard
    (keys of different shards may repeat). Same reading API as :class:`RecordFile`."""

    def __init__(
        self,
        manifest_path: str | os.PathLike[str],
        *,
        verify_checksums: bool = False,
        cache: bool = True,
    ) -> None:
        self.manifest_path = os.fspath(manifest_path)
        self.verify_checksums = verify_checksums
        self._cache = cache
        self._open()

    def _open(self) -> None:
        self.manifest = load_manifest(self.manifest_path)
        self.class_names = class_names(self.manifest)
        self._shards: list[RecordFile] = []
        try:
            for shard in self.manifest["shards"]:
                self._shards.append(
                    open_shard(
                        self.manifest_path,
                        shard,
                        verify_checksums=self.verify_checksums,
                        cache=self._cache,
                    )
                )
        except BaseException:
            self.close()
            raise
        self._starts = np.cumsum([0] + [len(s) for s in self.shards]).astype(np.int64)
        self._keys: np.ndarray | None = None

    @property
    def shards(self) -> list[RecordFile]:
        """The shards' readers, in manifest order."""
        return self._shards

    def __getstate__(self) -> dict:
        return {
            "manifest_path": self.manifest_path,
            "verify_checksums": self.verify_checksums,
            "cache": self._cache,
        }

    def __setstate__(self, state: dict) -> None:
        self.manifest_path = state["manifest_path"]
        self.verify_checksums = state["verify_checksums"]
        self._cache = state["cache"]
        self._open()

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __repr__(self) -> str:
        return f"RecordSet({self.manifest_path!r}, {len(self.shards)} shards, {len(self)} records)"

    def close(self) -> None:
        for s in self.shards:
            s.close()

    def images(self) -> RecordSet:
        """Every record of a stoker-packed set is an image: ``self``."""
        return self

    def locate(self, i: int) -> tuple[int, int]:
        """``(shard index, position inside that shard)`` of global position ``i``."""
        i = self._check_index(i)
        j = int(np.searchsorted(self._starts, i, side="right")) - 1
        return j, i - int(self._starts[j])

    def shard_of(self, i: int) -> int:
        return self.locate(i)[0]

    @property
    def keys(self) -> np.ndarray:
        if self._keys is None:
            parts = [s.keys for s in self.shards]
            self._keys = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return self._keys

    def key(self, i: int) -> int:
        j, k = self.locate(i)
        return self.shards[j].key(k)

    def offset(self, i: int) -> int:
        j, k = self.locate(i)
        return self.shards[j].offset(k)

    def read(self, i: int) -> memoryview:
        j, k = self.locate(i)
        return self.shards[j].read(k)

    def read_header(self, i: int) -> tuple[IRHeader, memoryview]:
        j, k = self.locate(i)
        return self.shards[j].read_header(k)

    def labels(self, positions: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
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
        shard = np.searchsorted(self._starts, pos, side="right") - 1
        pieces: list[tuple[np.ndarray, np.ndarray]] = []
        for j in np.unique(shard).tolist():
            sel = np.flatnonzero(shard == j)
            pieces.append((sel, self.shards[j].labels(pos[sel] - self._starts[j])))
        shapes = {p[1].shape[1:] for p in pieces}
        if len(shapes) > 1:
            raise ValueError(
                f"{self.manifest_path}: shards carry different label counts; "
                "pass positions= that select records of one layout"
            )
        out = np.empty((pos.shape[0], *pieces[0][1].shape[1:]), dtype=np.float32)
        for sel, lab in pieces:
            out[sel] = lab
        return out
