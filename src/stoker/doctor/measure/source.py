"""Opening SOURCE (an image folder, or a data set in any format stoker reads, through the
format registry) and picking the random sample every later measurement works on."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker._core.errors import StokerFormatError
from stoker._core.files import IMAGE_EXTENSIONS, scan_folder

if TYPE_CHECKING:
    from stoker.formats import Reader

__all__ = ["REMOTE_SHARDS", "SourceSample", "sample_source"]

#: The shards of a set in object storage the doctor's sample is drawn from (each is downloaded
#: whole when its first sampled record is read).
REMOTE_SHARDS = 4


@dataclass
class SourceSample:
    """What the doctor knows about SOURCE: its kind, size, and a random sample of it."""

    path: str
    kind: str  # "folder" | "records" (a data set in any format)
    count: int
    total_bytes: int
    files: list[str] = field(default_factory=list)  # folder: sampled paths
    positions: list[int] = field(default_factory=list)  # sampled positions (a folder's: listing)
    records: Reader | None = None  # the format's reader (stoker.formats.open) of a data set
    format: str | None = None  # its registry name

    @property
    def sampled(self) -> int:
        return len(self.files) if self.kind == "folder" else len(self.positions)

    def describe(self, j: int) -> tuple[int | None, str]:
        """``(key, where)`` of the ``j``-th sampled item, ``where`` as the loader names it in an
        error: a folder's key is the file's position in the listing (``key 53 (path)``), a data
        set's its record key (the format's own description)."""
        if self.kind == "folder":
            return self.positions[j], f"key {self.positions[j]} ({self.files[j]})"
        pos = self.positions[j]
        key: int | None = None
        where = f"position {pos} of {self.path}"
        if self.records is not None:
            with contextlib.suppress(Exception):
                key = int(self.records.key(pos))
            with contextlib.suppress(Exception):
                where = self.records.describe(pos)
        return key, where

    def close(self) -> None:
        if self.records is not None:
            with contextlib.suppress(Exception):
                self.records.close()
            self.records = None


def sample_source(path: str, *, n: int, seed: int = 0, remote: Any = None) -> SourceSample:
    """Open SOURCE and pick ``n`` random samples. Payloads are not read yet (the read stages
    do that). SOURCE may be a set's manifest URL (``remote``: how it is reached and cached):
    its samples are then drawn from a few of its shards (:data:`REMOTE_SHARDS`), so that
    reading them downloads no more."""
    from stoker.formats import format_of
    from stoker.formats.remote import remote_url
    from stoker.loader.sources.opening import set_format

    rng = np.random.default_rng(seed)
    path = os.fspath(path)
    if remote_url(path) is not None:
        return _sample_records(path, format_of(path, remote=remote), n, rng, remote)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    fmt = set_format(path)
    if fmt is None:
        return _sample_folder(path, n, rng)
    return _sample_records(path, fmt, n, rng, remote)  # a local index may name URLs


def _sample_folder(path: str, n: int, rng: np.random.Generator) -> SourceSample:
    files = [item.path for item in scan_folder(path).items]
    if not files:
        raise StokerFormatError(
            f"{path}: no image files found (looked for {', '.join(sorted(IMAGE_EXTENSIONS))})"
        )
    chosen = [int(i) for i in rng.choice(len(files), size=min(n, len(files)), replace=False)]
    pick = [files[i] for i in chosen]
    sizes = []
    for p in pick:
        with contextlib.suppress(OSError):
            sizes.append(os.path.getsize(p))
    total = int(np.mean(sizes) * len(files)) if sizes else 0  # estimated from the sample
    return SourceSample(path, "folder", len(files), total, files=pick, positions=chosen)


def _sample_records(
    path: str, fmt: Any, n: int, rng: np.random.Generator, remote: Any = None
) -> SourceSample:
    from stoker.formats import open_reader

    reader = open_reader(path, format=fmt.name, remote=remote)
    count = len(reader)
    if count == 0:
        reader.close()
        raise StokerFormatError(f"{path}: holds no records")
    total = 0
    for f in reader.files():
        with contextlib.suppress(OSError):
            total += os.path.getsize(f)
    pool = _remote_pool(reader, rng) if reader.remote() is not None else None
    if pool is None:
        chosen = sorted(int(i) for i in rng.choice(count, size=min(n, count), replace=False))
    else:
        chosen = sorted(int(i) for i in rng.choice(pool, size=min(n, pool.size), replace=False))
    return SourceSample(
        path, "records", count, total, positions=chosen, records=reader, format=fmt.name
    )


def _remote_pool(reader: Reader, rng: np.random.Generator) -> np.ndarray | None:
    """The positions of :data:`REMOTE_SHARDS` shards picked at random; ``None`` when the set
    has no more shards than that (every position may be drawn)."""
    sizes = reader.shard_sizes()
    if sizes is None or len(sizes) <= REMOTE_SHARDS:
        return None
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    picked = np.sort(rng.choice(len(sizes), size=REMOTE_SHARDS, replace=False))
    return np.concatenate([np.arange(starts[j], starts[j + 1]) for j in picked.tolist()])
