"""MXNet/dmlc-compatible RecordIO: reader, atomic/resumable writer, manifest, verifier.

See ``README.md`` in this folder (and ``docs/format.md``) for the byte layout.

- :func:`open_records` opens a ``.rec``, its ``.idx`` or a ``NAME.stoker.json`` manifest
  (several shards read as one) and checks the files against the manifest.
- :class:`RecordWriter` writes ``.rec`` + ``.idx`` (+ ``.crc32c``) atomically and resumes
  after a killed run.
- :func:`verify_records` walks a whole file and reports every problem.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from stoker._core.errors import ManifestError
from stoker.formats.base import Reader
from stoker.formats.recordio.header import (
    IR_SIZE,
    MAGIC,
    MAX_RECORD_BYTES,
    IRHeader,
    pack_header,
    unpack_header,
)
from stoker.formats.recordio.index import IndexTable, load_index, parse_idx, sha256_file
from stoker.formats.recordio.manifest import (
    MANIFEST_SUFFIX,
    load_manifest,
    make_manifest,
    shard_entry,
    validate_manifest,
    write_manifest,
)
from stoker.formats.recordio.reader import (
    ImageRecords,
    RecordFile,
    default_crc_path,
    default_idx_path,
    iter_records,
    scan_offsets,
)
from stoker.formats.recordio.verify import Problem, VerifyReport, verify_records
from stoker.formats.recordio.writer import RecordWriter, ShardInfo, frame_record

__all__ = [
    "IR_SIZE",
    "MAGIC",
    "MANIFEST_SUFFIX",
    "MAX_RECORD_BYTES",
    "IRHeader",
    "ImageRecords",
    "IndexTable",
    "Problem",
    "RecordFile",
    "RecordSet",
    "RecordWriter",
    "ShardInfo",
    "VerifyReport",
    "default_crc_path",
    "default_idx_path",
    "frame_record",
    "iter_records",
    "load_index",
    "load_manifest",
    "make_manifest",
    "manifest_path_for",
    "open_records",
    "pack_header",
    "parse_idx",
    "scan_offsets",
    "shard_entry",
    "unpack_header",
    "validate_manifest",
    "verify_records",
    "write_manifest",
]


def manifest_path_for(rec_path: str | os.PathLike[str]) -> str:
    """``NAME.stoker.json`` beside ``NAME.rec``."""
    p = os.fspath(rec_path)
    return (p[:-4] if p.endswith(".rec") else p) + MANIFEST_SUFFIX


def _class_names(manifest: dict) -> list[str]:
    classes = manifest.get("classes") or {}
    names = [""] * len(classes)
    for name, cid in classes.items():
        names[cid] = name
    return names


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


def _open_shard(base: str, shard: dict, manifest_path: str, **kw: Any) -> RecordFile:
    crc = shard.get("crc32c")
    r = RecordFile(
        os.path.join(base, shard["rec"]),
        os.path.join(base, shard["idx"]),
        crc_path=os.path.join(base, crc) if crc else None,
        **kw,
    )
    try:
        _check_shard(r, shard, manifest_path)
    except BaseException:
        r.close()
        raise
    return r


class RecordSet(Reader):
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
        self.class_names: list[str] | None = _class_names(self.manifest)
        base = os.path.dirname(os.path.abspath(self.manifest_path))
        self.shards: list[RecordFile] = []
        try:
            for shard in self.manifest["shards"]:
                self.shards.append(
                    _open_shard(
                        base,
                        shard,
                        self.manifest_path,
                        verify_checksums=self.verify_checksums,
                        cache=self._cache,
                    )
                )
        except BaseException:
            self.close()
            raise
        self._starts = np.cumsum([0] + [len(s) for s in self.shards]).astype(np.int64)
        self._keys: np.ndarray | None = None

    identity_ranges = None
    image_keys = None
    image_positions = None

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


def open_records(
    path: str | os.PathLike[str], *, verify_checksums: bool = False, cache: bool = True
) -> RecordFile | RecordSet:
    """Open a ``.rec``, its ``.idx``, or a ``NAME.stoker.json`` manifest.

    A manifest with one shard (or a ``.rec`` with ``NAME.stoker.json`` beside it) gives a
    :class:`RecordFile` with ``class_names`` and ``manifest`` set; several shards give a
    :class:`RecordSet`. The files are checked against the manifest (``.rec`` size, ``.idx``
    sha256, record count): a mismatch raises :class:`ManifestError`. ``verify_checksums``
    checks each read against the CRC32C side file. ``identity_ranges``/``image_keys`` are
    set for insightface-layout files.
    """
    p = os.fspath(path)
    kw = {"verify_checksums": verify_checksums, "cache": cache}
    if p.endswith(MANIFEST_SUFFIX):
        manifest = load_manifest(p)
        if len(manifest["shards"]) != 1:
            return RecordSet(p, verify_checksums=verify_checksums, cache=cache)
        r = _open_shard(os.path.dirname(os.path.abspath(p)), manifest["shards"][0], p, **kw)
        r.manifest, r.class_names = manifest, _class_names(manifest)
        return r
    if p.endswith(".idx"):
        rec = p[:-4] + ".rec"
        if not os.path.exists(rec):
            raise FileNotFoundError(f"{p}: no {os.path.basename(rec)} beside it")
        idx: str | None = p
        p = rec
    else:
        idx = None
    mpath = manifest_path_for(p)
    if os.path.exists(mpath):
        manifest = load_manifest(mpath)
        base = os.path.dirname(os.path.abspath(mpath))
        me = os.path.abspath(p)
        for shard in manifest["shards"]:
            if os.path.abspath(os.path.join(base, shard["rec"])) == me:
                r = _open_shard(base, shard, mpath, **kw)
                r.manifest, r.class_names = manifest, _class_names(manifest)
                return r
    crc = default_crc_path(p)
    return RecordFile(
        p,
        idx,
        crc_path=crc if os.path.exists(crc) else None,
        **kw,  # type: ignore[arg-type]
    )
