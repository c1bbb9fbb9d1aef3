"""A WebDataset set in object storage: its manifest read through the node's shard cache, and
each ``.tar`` shard read from a pinned copy there (:mod:`stoker.formats.shardfiles`).

A tar's member index is cached under the shard cache's key of its copy (its URL, size and
CRC), so any process of the node that indexed a shard spares the others the download: a
shard is downloaded to read its samples. The samples' count per shard comes from the
manifest, and every label is an int64, so opening the set reads no shard.
"""

from __future__ import annotations

from stoker.formats.remote import RemoteOptions
from stoker.formats.shardfiles import HeldShard, RemoteShards, ShardFile, open_remote_set
from stoker.formats.wds.manifest import validate_manifest
from stoker.formats.wds.shard import Shard

__all__ = ["RemoteTar", "open_remote"]


def _files(j: int, s: dict) -> list[ShardFile]:
    """The tar, then its per-sample checksums when the manifest names them (4 bytes each)."""
    tar = ShardFile(s["tar"], f"shards[{j}].tar", int(s["tar_bytes"]), sha256=s.get("sha256"))
    if s.get("crc32c") is None:
        return [tar]
    return [tar, ShardFile(s["crc32c"], f"shards[{j}].crc32c", 4 * int(s["records"]))]


def open_remote(
    url: str, options: RemoteOptions | None, opened: RemoteShards | None, *, cap: int
) -> tuple[RemoteShards, dict]:
    """The shards and manifest of the stoker-wds set at ``url`` (``opened``: as another
    process opened it)."""
    return open_remote_set(url, options, opened, validate_manifest, _files, cap=cap)


class RemoteTar(HeldShard, Shard):
    """Shard ``j`` of a remote set: mapped from its pinned cached copy while the reader holds
    it (``manifest``: the set's URL, for messages)."""

    def __init__(
        self, shards: RemoteShards, j: int, entry: dict, *, manifest: str, cache: bool
    ) -> None:
        super().__init__(
            shards.location(j),
            records=entry["records"],
            tar_bytes=entry["tar_bytes"],
            manifest=manifest,
            cache=cache,
            crc=shards.location(j, 1) if entry.get("crc32c") is not None else None,
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
