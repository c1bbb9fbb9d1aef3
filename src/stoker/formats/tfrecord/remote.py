"""A TFRecord set in object storage (opened by :func:`stoker.formats.opening.open_set`): each
``.tfrecord`` shard read from a pinned copy in the node's shard cache
(:mod:`stoker.formats.shardfiles`).

A shard's record offsets and what one scan of its Examples learns (labels, keys, field lengths,
image spans: :mod:`stoker.formats.tfrecord.index`) are cached under the shard cache's key of its
copy (its URL, size and CRC), so the process that opens the set downloads and scans each shard
once per node, and every other process (workers, other ranks, later runs) finds the results
without the shard: it downloads a shard only to read its records.
"""

from __future__ import annotations

from typing import Any

from stoker.formats.shardfiles import HeldShard, RemoteShards
from stoker.formats.tfrecord.features import FeaturePlan
from stoker.formats.tfrecord.index import cached_meta, cached_offsets, load_meta, load_offsets
from stoker.formats.tfrecord.shard import Shard

__all__ = ["RemoteShard"]


class RemoteShard(HeldShard, Shard):
    """Shard ``j`` of a remote set: mapped from its pinned cached copy while the reader holds
    it; its offsets and scan results from the index cache, else from one scan of the copy."""

    def __init__(self, shards: RemoteShards, j: int, plan: FeaturePlan, *, cache: bool) -> None:
        self.shards, self.j = shards, j
        self.path = shards.location(j)
        self.mm = None
        self.view = memoryview(b"")
        self.size = shards.entries[j][0].size
        ident = shards.identity(j)
        kw: dict[str, Any] = {"cache": cache, "identity": ident}
        offsets = cached_offsets(self.path, self.size, **kw)
        meta = None if offsets is None else cached_meta(self.path, self.size, offsets, plan, **kw)
        if offsets is None or meta is None:
            self.map()
            try:
                offsets = load_offsets(self.path, self.view, self.size, **kw)
                meta = load_meta(self.path, self.view, self.size, offsets, plan, **kw)
            finally:
                self.unmap()
        self.offsets, self.meta = offsets, meta

    def unmap(self) -> None:
        try:
            super().unmap()
        finally:
            self.let_go()
