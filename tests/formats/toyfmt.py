"""A format defined outside stoker (docs/contracts.md): a file is ``TOY1`` and blocks, each
``<II`` (records, compressed bytes) and a zlib stream of int64 (key, label, image bytes) per
record and the JPEGs; a record reads by decompressing its block. Importing it registers it."""

from __future__ import annotations

import functools
import hashlib
import os
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from stoker._core.errors import CorruptRecordError
from stoker._core.schema import Schema
from stoker.formats import manifest, registry
from stoker.formats.base import ReadRecord, Shard
from stoker.formats.report import Problem, VerifyReport
from stoker.formats.sharded import SetPlan, ShardedReader, ShardFiles

MAGIC, BLOCK = b"TOY1", struct.Struct("<II")


def scan(path: str, at: int = 4, name: str | None = None) -> Iterator[tuple[int, list]]:
    """``(byte offset, [(key, label, image)])`` of each block of the shard file ``path`` from
    byte offset ``at``; an error names ``name`` (the shard's path or URL) and the offset."""
    where = name or path
    with open(path, "rb") as f:
        if f.read(4) != MAGIC:
            raise CorruptRecordError(where, 0, "not a toy shard (no TOY1 magic)")
        f.seek(at)
        while head := f.read(BLOCK.size):
            off, (count, size) = f.tell() - len(head), BLOCK.unpack(head.ljust(BLOCK.size))
            try:
                raw = zlib.decompress(f.read(size))
                table = np.frombuffer(raw, "<i8", 3 * count).reshape(count, 3).tolist()
            except (zlib.error, ValueError) as e:
                raise CorruptRecordError(where, off, f"a broken block: {e}") from None
            ends = (24 * count + np.cumsum([n for _, _, n in table])).tolist()
            if ends and ends[-1] != len(raw):
                raise CorruptRecordError(where, off, f"{len(raw)} bytes, {ends[-1]} expected")
            yield off, [(k, y, raw[e - n : e]) for (k, y, n), e in zip(table, ends)]


class ToyShard(Shard):
    """One shard: keys, labels, blocks from one scan; a reader keeps its last block."""

    schema = Schema.classification()

    @classmethod
    def plan(cls, manifest: dict | None, where: str, **options: Any) -> SetPlan:
        return SetPlan(schema=cls.schema, label_kind=((), "int64"), blocks=True)

    def __init__(self, files: ShardFiles, plan: SetPlan) -> None:
        self.files, self.path = files, files.where
        blocks = list(scan(str(files.path("data")), name=self.path))  # remote: a pinned copy
        self.offsets = [off for off, _ in blocks]
        self.blocks = np.cumsum([0] + [len(r) for _, r in blocks[:-1]]).astype(np.int64)
        every = np.array([(k, lab) for _, records in blocks for k, lab, _ in records], np.int64)
        self._keys, self._labels = every.reshape(-1, 2).T.copy()

    def __len__(self) -> int:
        return len(self._keys)

    def keys(self) -> np.ndarray:
        return self._keys

    def labels(self) -> np.ndarray:
        return self._labels

    def where(self, r: int) -> tuple[int, str]:
        b = int(np.searchsorted(self.blocks, r, side="right")) - 1
        return self.offsets[b], f"record {r} (block {b})"

    def reader(self, rows: np.ndarray | None, fields: tuple[str, ...]) -> ReadRecord:
        @functools.lru_cache(maxsize=1)
        def block(b: int) -> list:
            return next(scan(str(self.files.path("data")), self.offsets[b], self.path))[1]

        def read(r: int, key: int) -> tuple[Any, Any, dict[str, Any]]:
            b = int(np.searchsorted(self.blocks, r, side="right")) - 1
            _, label, image = block(b)[r - int(self.blocks[b])]
            return image, label, {}

        return read

    def close(self) -> None:
        self.files.let_go()


def open_reader(path: str | os.PathLike[str], *, remote: Any = None) -> ShardedReader:
    return ShardedReader(path, format="toy", remote=remote)


def write_manifest(manifest_path: str, shards: list, **fields: Any) -> None:
    manifest.write_set("toy", manifest_path, shards, **fields)


def write_set(prefix: str, blobs: list, labels: list, shard: int, block: int, classes: int) -> str:
    """The set at ``prefix``: shards of ``shard`` records in blocks of ``block``; its manifest."""
    entries = []
    for j, start in enumerate(range(0, len(blobs), shard)):
        out, ks = bytearray(MAGIC), range(start, min(start + shard, len(blobs)))
        for part in (ks[b : b + block] for b in range(0, len(ks), block)):
            table = np.array([(k, labels[k], len(blobs[k])) for k in part], "<i8")
            raw = table.tobytes() + b"".join(blobs[k] for k in part)
            out += BLOCK.pack(len(part), len(z := zlib.compress(raw))) + z
        with open(path := os.path.abspath(f"{prefix}-{j:05d}.toy"), "wb") as f:
            f.write(out)
        sums = {"data.sha256": hashlib.sha256(out).hexdigest()}
        entries.append(dict(files={"data": path}, records=len(ks), bytes=len(out), checksums=sums))
    names = {f"c{c}": c for c in range(classes)}
    write_manifest(m := prefix + ".stoker.json", entries, classes=names)
    return m


def verify(path: str, *, checksums: bool = True, **options: Any) -> VerifyReport:
    """Walk every shard a local manifest lists: its checksum and its blocks."""
    report = VerifyReport(str(path), max_problems=options.get("max_problems", 1000))
    for e in manifest.load(path, kind="toy")["shards"]:
        p = str(manifest.shard_file(path, e, "data"))
        with open(p, "rb") as f:
            data = f.read()
        report.data_bytes += len(data)
        if checksums and hashlib.sha256(data).hexdigest() != e.checksums["data.sha256"]:
            report.add(Problem(p, None, None, "checksum mismatch: data.sha256 differs"))
        try:
            report.records += sum(len(records) for _, records in scan(p))
        except CorruptRecordError as err:
            report.add(Problem(p, err.key, err.offset, err.reason))
    report.indexed, report.checksummed = report.records, report.records if checksums else 0
    return report


FORMAT = registry.register(
    registry.Format(
        "toy",
        reader=f"{__name__}:open_reader",
        extensions=(".toy",),
        manifest=f"{__name__}:write_manifest",
        verify=f"{__name__}:verify",
        remote=True,
        roles={"data": ".toy"},
        checksums=("data.sha256",),
        open_shard=f"{__name__}:ToyShard",
    )
)
