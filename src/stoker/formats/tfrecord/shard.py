"""One ``.tfrecord`` shard: the file mapped read-only, its record offsets and what one scan of
its Examples learns (:mod:`stoker.formats.tfrecord.index`); what the reader of a local set and
of a set in object storage (:mod:`stoker.formats.tfrecord.remote`) read through.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from typing import Any

from stoker._core.errors import CorruptRecordError
from stoker.formats.tfrecord.features import FeaturePlan, default_plan
from stoker.formats.tfrecord.framing import HEADER, looks_gzip
from stoker.formats.tfrecord.index import ShardMeta, load_meta, load_offsets

__all__ = ["GZIP_HELP", "Shard", "check_not_gzip", "open_shard"]

GZIP_HELP = (
    "this is a GZIP-compressed TFRecord file; stoker reads TFRecord by random access (any "
    "record, in any order, from any worker), which a GZIP stream cannot give without "
    "decompressing everything before the record. Decompress it once and open the result: "
    "gunzip -k FILE.tfrecord.gz (or: python -m gzip -d FILE.tfrecord.gz)"
)


def check_not_gzip(path: str, head: bytes) -> None:
    """Refuse a GZIP-compressed file with the way out (see ``GZIP_HELP``)."""
    if path.lower().endswith((".gz", ".gzip")) or looks_gzip(head):
        raise CorruptRecordError(path, 0, GZIP_HELP)


class Shard:
    """One mapped file with its index and scan results."""

    def __init__(self, path: str, plan: FeaturePlan, *, cache: bool) -> None:
        self.path = path
        self.mm: mmap.mmap | None = None
        self.view = memoryview(b"")
        self.size = 0
        self.map()
        try:
            self.offsets = load_offsets(path, self.view, self.size, cache=cache)
            self.meta: ShardMeta = load_meta(
                path, self.view, self.size, self.offsets, plan, cache=cache
            )
        except BaseException:
            self.unmap()
            raise

    def local(self) -> str:
        """The local file holding the bytes (a shard in object storage: its pinned copy)."""
        return self.path

    def map(self) -> None:
        with open(self.local(), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            check_not_gzip(self.path, f.read(HEADER))
            if self.mm is not None or (self.size and size != self.size):
                raise CorruptRecordError(
                    self.path,
                    None,
                    f"the file changed since it was indexed ({size} bytes now, {self.size} "
                    "then); reopen the data set",
                )
            self.size = size
            if size:
                self.mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
                self.view = memoryview(self.mm)

    def unmap(self) -> None:
        view, mm = self.view, self.mm
        self.view, self.mm = memoryview(b""), None
        try:
            view.release()
        except BufferError:  # a caller still holds an image view; the GC unmaps later
            return
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass

    def check_size(self, i: int, key: int) -> None:
        # Touching a page past the end of a file truncated in place raises SIGBUS; one
        # fstat per read turns the usual case into a clean error.
        if self.mm is not None and self.mm.size() < self.size:
            raise CorruptRecordError(
                self.path,
                int(self.offsets[i]),
                f"record {i}: the file was truncated in place while open ({self.mm.size()} "
                f"bytes now, {self.size} at open); replace files (os.replace), do not rewrite them",
                key=key,
            )


def open_shard(
    paths: Mapping[str, Any], *, plan: FeaturePlan | None = None, cache: bool = True
) -> Shard:
    """One ``.tfrecord`` (``paths["data"]``) mapped and indexed, read as ``plan`` says (the
    usual features when ``None``)."""
    return Shard(paths["data"], default_plan() if plan is None else plan, cache=cache)
