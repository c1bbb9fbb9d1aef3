"""The run's plan: which files, in which order, under which keys and in which shard, all fixed
before any image is read.

For an image folder the key of a file is its position in the (sorted or shuffled) list of
candidate image files; a file rejected while checking leaves a gap. For an im2rec list the key
is the list's index column, as im2rec does. Shard ``s`` (``shard_size=N``) holds positions
``[s*N, (s+1)*N)``, so rejects make shards slightly short.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._core.errors import PackError
from stoker._core.seeding import stream_rng
from stoker.pack.options import PackOptions
from stoker.pack.scan import Item, ScanResult, read_lst, scan_folder

__all__ = ["Plan", "fingerprint", "make_plan"]

_DOMAIN_SHUFFLE = 0x50414B53  # "PAKS"


@dataclass
class Plan:
    """The listing, the items in record order, their keys, and the shard layout."""

    scan: ScanResult
    from_lst: bool  # the source is an im2rec list (keys from its index column)
    items: list[Item]
    keys: np.ndarray  # int64, by position
    shard_size: int | None
    prefix: str

    @property
    def n_shards(self) -> int:
        if self.shard_size is None:
            return 1
        return max(1, -(-len(self.items) // self.shard_size))

    def shard_of(self, pos: int) -> int:
        return 0 if self.shard_size is None else pos // self.shard_size

    def rec_path(self, s: int) -> str:
        if self.shard_size is None:
            return self.prefix + ".rec"
        return f"{self.prefix}-{s:05d}.rec"


def _list_source(options: PackOptions) -> tuple[ScanResult, bool]:
    """The source's listing, and whether it is an im2rec list."""
    src = os.fspath(options.src)
    if os.path.isdir(src):
        return scan_folder(src, follow_symlinks=options.follow_symlinks), False
    if os.path.isfile(src) and src.endswith(".lst"):
        return read_lst(src, root=options.root, allow_outside_root=options.allow_outside_root), True
    if not os.path.exists(src):
        raise PackError(f"{src}: no such file or folder")
    raise PackError(f"{src}: give an image folder or an im2rec .lst file")


def make_plan(options: PackOptions) -> Plan:
    """List the source once (a snapshot) and fix the order and keys of every record."""
    scan, from_lst = _list_source(options)
    items = scan.items
    if options.shuffle:
        perm = stream_rng(options.seed, _DOMAIN_SHUFFLE, len(items)).permutation(len(items))
        items = [items[i] for i in perm]
    if from_lst:
        keys = np.asarray([it.key for it in items], dtype=np.int64)
    else:
        keys = np.arange(len(items), dtype=np.int64)
    return Plan(scan, from_lst, items, keys, options.shard_size, options.prefix)


def fingerprint(plan: Plan, settings: dict[str, Any]) -> str:
    """A digest of the settings and of every record's key, label and path: a rerun resumes
    the partial output only when it is equal."""
    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode())
    for key, it in zip(plan.keys.tolist(), plan.items):
        h.update(f"{key}\t{it.label!r}\t".encode())
        h.update(os.fsencode(it.path))
        h.update(b"\n")
    return h.hexdigest()
