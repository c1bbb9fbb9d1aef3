"""Opening SOURCE (an image folder, a ``.rec``/``.idx`` or a ``.stoker.json``) and picking the
random sample every later measurement works on."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from stoker._core.errors import StokerFormatError
from stoker._core.files import IMAGE_EXTENSIONS, scan_folder

if TYPE_CHECKING:
    from stoker.formats.recordio import RecordFile, RecordSet

__all__ = ["SourceSample", "record_files", "sample_source"]


@dataclass
class SourceSample:
    """What the doctor knows about SOURCE: its kind, size, and a random sample of it."""

    path: str
    kind: str  # "folder" | "records"
    count: int
    total_bytes: int
    files: list[str] = field(default_factory=list)  # folder: sampled paths
    positions: list[int] = field(default_factory=list)  # records: sampled positions
    records: RecordFile | RecordSet | None = None  # the open_records object of a records source

    def close(self) -> None:
        if self.records is not None:
            with contextlib.suppress(Exception):
                self.records.close()
            self.records = None


def record_files(records: RecordFile | RecordSet) -> list[RecordFile]:
    """The ``.rec`` files behind an open records source: the shards of a set, or itself."""
    from stoker.formats.recordio import RecordSet

    return list(records.shards) if isinstance(records, RecordSet) else [records]


def sample_source(path: str, *, n: int, seed: int = 0) -> SourceSample:
    """Open SOURCE and pick ``n`` random samples. Payloads are not read yet (the read stages
    do that)."""
    rng = np.random.default_rng(seed)
    path = os.fspath(path)
    if os.path.isdir(path):
        return _sample_folder(path, n, rng)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    return _sample_records(path, n, rng)


def _sample_folder(path: str, n: int, rng: np.random.Generator) -> SourceSample:
    files = [item.path for item in scan_folder(path).items]
    if not files:
        raise StokerFormatError(
            f"{path}: no image files found (looked for {', '.join(sorted(IMAGE_EXTENSIONS))})"
        )
    pick = [files[i] for i in rng.choice(len(files), size=min(n, len(files)), replace=False)]
    sizes = []
    for p in pick:
        with contextlib.suppress(OSError):
            sizes.append(os.path.getsize(p))
    total = int(np.mean(sizes) * len(files)) if sizes else 0  # estimated from the sample
    return SourceSample(path, "folder", len(files), total, files=pick)


def _sample_records(path: str, n: int, rng: np.random.Generator) -> SourceSample:
    try:
        from stoker.formats.recordio import open_records
    except ImportError as e:  # pragma: no cover - the formats room is part of stoker
        raise StokerFormatError(
            f"{path}: reading RecordIO needs stoker.formats.recordio ({e})"
        ) from e
    records = open_records(path)
    count = len(records)
    if count == 0:
        records.close()
        raise StokerFormatError(f"{path}: holds no records")
    total = 0
    for r in record_files(records):
        with contextlib.suppress(OSError):
            total += os.path.getsize(r.path)
    chosen = sorted(int(i) for i in rng.choice(count, size=min(n, count), replace=False))
    return SourceSample(path, "records", count, total, positions=chosen, records=records)
