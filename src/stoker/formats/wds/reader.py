"""The :class:`~stoker.formats.Reader` of WebDataset tar shards: one ``.tar``, or the shards a
stoker-written ``NAME.stoker.json`` (``"kind": "wds"``) lists, read as one set: a
:class:`~stoker.formats.sharded.ShardedReader` of :class:`~stoker.formats.wds.shard.WdsShard`.

Positions ``0..N-1`` run through the shards in manifest order. WebDataset keys are strings, so
the reader's int keys are the positions; ``key_name(i)`` gives the member key and
``describe(i)`` the tar, the key and the byte offset of the sample's first header.

The schema is the manifest's (``Schema.classification()`` when it declares none); a tar
without a manifest has an image, its ``cls`` label, and text fields ``txt`` and ``json`` when
any sample holds such a member (``layout``). Labels: the ``.cls`` values, or 0 for every sample
of a set without any ``.cls``. Opening a set in object storage reads no shard: the samples'
count per shard comes from the manifest.
"""

from __future__ import annotations

import os
from typing import Any

from stoker.formats.sharded import RemoteOptions, ShardedReader

__all__ = ["WdsReader", "open_reader"]


def open_reader(
    path: str | os.PathLike[str], *, cache: bool = True, remote: RemoteOptions | None = None
) -> WdsReader:
    """The reader of a ``.tar`` or a stoker-wds manifest (``cache=False``: no index cache;
    ``remote``: how to reach and cache a manifest's URL)."""
    return WdsReader(path, cache=cache, remote=remote)


class WdsReader(ShardedReader):
    """WebDataset shards with random access; see the module docstring. ``path`` may be a
    manifest's URL (``remote``: how to reach and cache it): each tar is read from a pinned
    copy in the node's shard cache (``docs/remote.md``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        cache: bool = True,
        remote: RemoteOptions | None = None,
    ) -> None:
        super().__init__(path, format="wds", remote=remote, cache=bool(cache))

    def key_name(self, i: int) -> str:
        """The WebDataset key (member name up to the first dot) of sample ``i``."""
        j, r = self.where(i)
        shard: Any = self.shard(j)
        return shard.index().key_name(r)
