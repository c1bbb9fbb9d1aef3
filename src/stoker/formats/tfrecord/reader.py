"""The :class:`~stoker.formats.Reader` of TFRecord: one ``.tfrecord`` file, or every shard a
TFRecord set's manifest lists, as one data set with random access by position: a
:class:`~stoker.formats.sharded.ShardedReader` of :class:`~stoker.formats.tfrecord.shard.
TFRecordShard`.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from stoker.formats.report import spread
from stoker.formats.sharded import RemoteOptions, ShardedReader
from stoker.formats.tfrecord.shard import DEFAULT_KEYS

__all__ = ["TFRecordReader"]


class TFRecordReader(ShardedReader):
    """TFRecord data set; see the module docstring and the package README.

    ``path``: a ``.tfrecord`` file, or a ``NAME.stoker.json`` of a TFRecord set.
    For a bare file, ``image_key``, ``label_key``, ``boxes_key`` (the prefix of the four
    ``/xmin`` ... features) and ``classes_key`` name the features (``None`` turns the label,
    boxes or classes off) and ``features={field: feature}`` (or ``{field: (feature,
    Field)}``) adds fields; a manifest names its own. ``checksums=False`` skips the data CRC
    on reads (the length CRC is always checked). ``cache=False`` neither reads nor writes the
    index cache. ``path`` may be a manifest's URL (``remote``: how to reach and cache it):
    each shard is read from a pinned copy in the node's shard cache (``docs/remote.md``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        image_key: str = DEFAULT_KEYS["image_key"],
        label_key: str | None = DEFAULT_KEYS["label_key"],
        boxes_key: str | None = DEFAULT_KEYS["boxes_key"],
        classes_key: str | None = DEFAULT_KEYS["classes_key"],
        features: dict[str, Any] | None = None,
        checksums: bool = True,
        cache: bool = True,
        remote: RemoteOptions | None = None,
    ) -> None:
        keys = {
            "image_key": image_key,
            "label_key": label_key,
            "boxes_key": boxes_key,
            "classes_key": classes_key,
        }
        asked = bool(features) or keys != DEFAULT_KEYS
        # a stoker shard with its manifest beside it: read with the manifest's features
        super().__init__(
            path,
            format="tfrecord",
            remote=remote,
            sibling=not asked,
            features=dict(features or {}),
            checksums=bool(checksums),
            cache=bool(cache),
            **keys,
        )
        if self._remote is None:  # a local set: every shard scanned at open, a bad file fails here
            self.keys()
            self.labels()

    def summary(self) -> dict:
        """What ``stoker inspect`` shows: shards, bytes, bytes per record (min, median, mean,
        max over every record, framing included), the features read, the label, the keys."""
        shards: list[Any] = self._all()
        sizes = np.concatenate(
            [np.diff(np.append(s.offsets, s.size)) for s in shards if s.offsets.size]
        )
        res = next(s.meta.resolved for s in shards if s.meta.resolved is not None)
        return {
            "shards": len(shards),
            "bytes": int(sum(s.size for s in shards)),
            "bytes_per_record": spread(sizes),
            "features": {n: ft for n, ft, _f in res.entries},
            "label_feature": next((ft for n, ft, _f in res.entries if n == res.label), None),
            "keys": res.key_feature if res.keyed else "record positions",
        }
