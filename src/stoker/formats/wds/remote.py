"""A WebDataset set in object storage (opened by :func:`stoker.formats.opening.open_set`):
each ``.tar`` shard read from a pinned copy in the node's shard cache
(:mod:`stoker.formats.shardfiles`).

A tar's member index is cached under the shard cache's key of its copy (its URL, size and
CRC), so any process of the node that indexed a shard spares the others the download: a
shard is downloaded to read its samples. The samples' count per shard comes from the
manifest, and every label is an int64, so opening the set reads no shard.
"""

from __future__ import annotations

from stoker.formats.shardfiles import HeldShard, RemoteShards
from stoker.formats.shards import ShardEntry
from stoker.formats.wds.shard import Shard

__all__ = ["RemoteTar"]


class RemoteTar(HeldShard, Shard):
    """Shard ``j`` of a remote set: mapped from its pinned cached copy while the reader holds
    it (``manifest``: the set's URL, for messages)."""

    def __init__(
        self, shards: RemoteShards, j: int, entry: ShardEntry, *, manifest: str, cache: bool
    ) -> None:
        super().__init__(
            shards.location(j),
            records=entry.records,
            tar_bytes=entry.bytes,
            manifest=manifest,
            cache=cache,
            crc=shards.location(j, 1) if "crc" in entry.files else None,
        )
        self.shards, self.j = shards, j
        self.identity = shards.identity(j)

    def local_crc(self) -> str:
        return self.shards.hold(self.j)[1]

    def _drop(self) -> None:
        try:
            super()._drop()
        finally:
            self.let_go()
