"""Packing as independent shard jobs: a plan file, shards packed anywhere, then a finalize.

NOTE [ Plan, shard jobs and finalize ]

Plan
    :func:`write_plan` (``planfile.py``) lists SRC and writes the plan file: the options that
    decide the output, the plan's fingerprint (a digest of the settings and of every
    record's key, label and path, and of a listing's fields) and each shard's positions.

Shard job
    :func:`pack_shards` reads the plan, lists SRC again and refuses when the fingerprint
    differs (SRC or the check changed since the plan was made). Each shard it is given is
    packed into its final files, records in position order through the format's writer with
    the labels and fields a one-machine pack gives them (``records.sample_of``), each file
    written as ``*.partial`` and renamed; then ``OUT-NNNNN.pack-shard.json`` (``OUT.pack-
    shard.json`` unsharded) is written atomically: the plan's fingerprint, the shard's manifest
    entry, its files and their sizes, what each record counts for in the manifest and the
    shard's rejects. That side-car is the shard's commit point. A job holds an exclusive lock
    on ``OUT-NNNNN.pack-shard.lock`` while it works on the shard, so two jobs of one shard
    (a rerun beside a job of a killed driver that is still running) take turns. A shard whose side-car is of
    this plan and whose files have its sizes and verify (framing and every record's CRC) is
    done, and a rerun skips it; any other state (a job killed mid-shard, files renamed but no
    side-car, a damaged file) is packed again from scratch, to the same bytes.

Finalize
    :func:`finalize_pack` checks every shard as a rerun does and refuses, naming each shard
    that is missing or damaged; then merges the records' counts and the rejects in position
    order, applies ``max_rejects`` to the total, and writes the rejects list, the ``.lst``
    and the manifest last through ``setfiles.write_set_files``, the code a one-machine pack
    commits with: the set is byte for byte that pack's. The side-cars and locks are removed after the
    manifest; the plan file stays.

Convert
    ``stoker convert`` runs the same steps: the plan records that it is a convert, the
    source's format and its reader's options (``source_options``; a URL source's
    ``RemoteOptions`` without ``storage_options``, which each step is given again); a shard
    job reads the source's positions in its own process (``records.convert_range``) and its side-car keeps the
    longest variable field it wrote, which finalize merges into the manifest's schema.

A URL OUT
    Each shard job stages its shard under the cache folder of its own machine, uploads the
    files, then its side-car; finalize checks the objects and uploads the manifest last
    (``remote.py``). The plan file stays a local path.

A decoder crash in a shard job run by a local pool is isolated as in a one-machine pack
(``decoder_crash``); in a Ray task (checked in the task's own process) it kills the task,
which Ray retries and finally reports as the shard's failure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker._core.progress import make_progress
from stoker.pack.commit.destination import destination
from stoker.pack.engines.jobs import LocalEngine, ShardJob
from stoker.pack.engines.planfile import load_plan, parse_shards, plan_pack, write_plan
from stoker.pack.run.report import PackReport
from stoker.pack.run.shardjob import ShardOutcome, shard_bounds

__all__ = [
    "ShardsReport",
    "finalize_pack",
    "load_plan",
    "pack_shards",
    "parse_shards",
    "plan_pack",
    "write_plan",
]


# ---------------------------------------------------------------- the steps
@dataclass(frozen=True)
class ShardsReport:
    """What :func:`pack_shards` did: the shards packed and those skipped (done already)."""

    packed: tuple[int, ...]
    skipped: tuple[int, ...]
    written: int
    rejected: int
    seconds: float

    def summary(self) -> str:
        return (
            f"shards packed {len(self.packed)}, skipped {len(self.skipped)} (done already): "
            f"{self.written} records written, {self.rejected} rejected in {self.seconds:.1f} s"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "packed": list(self.packed),
            "skipped": list(self.skipped),
            "written": self.written,
            "rejected": self.rejected,
            "seconds": round(self.seconds, 3),
        }


def pack_shards(
    plan: str | os.PathLike[str],
    shards: Any = None,
    *,
    workers: int | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> ShardsReport:
    """Pack the shards ``shards`` (``"a:b"``, ``"3"``, an int, a slice or a range; ``None``:
    all) of the plan file ``plan`` with a local pool of ``workers`` processes; shards done
    already are verified and skipped. A URL OUT: each shard is staged here and uploaded
    (``storage_options``: how SRC and OUT URLs are reached)."""
    t0 = time.perf_counter()
    options, p, fp = load_plan(
        plan, workers=workers, progress=progress, storage_options=storage_options
    )
    todo = parse_shards(":" if shards is None else shards, p.n_shards)
    n_pos = sum(b - a for a, b in (shard_bounds(p, s) for s in todo))
    what = "convert" if options.convert else "pack"
    bar = make_progress(n_pos, what, unit="img", enabled=options.progress)
    job = ShardJob(options, p, fp, storage_options)
    outcomes: list[ShardOutcome] = []
    try:
        outcomes.extend(LocalEngine(options.worker_count()).run(job, todo, bar))
    finally:
        bar.close()
    return ShardsReport(
        packed=tuple(o.shard for o in outcomes if not o.skipped),
        skipped=tuple(o.shard for o in outcomes if o.skipped),
        written=sum(o.written for o in outcomes),
        rejected=sum(o.rejected for o in outcomes),
        seconds=time.perf_counter() - t0,
    )


def finalize_pack(
    plan: str | os.PathLike[str],
    *,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PackReport:
    """Check every shard of the plan file ``plan`` and write the rejects list, the ``.lst``
    and the manifest (last); the set's :class:`PackReport`. A :class:`PackError` names each
    shard that is missing or damaged. A URL OUT: the shard objects are checked there and the
    manifest uploaded last (``storage_options``: how SRC and OUT URLs are reached)."""
    t0 = time.perf_counter()
    options, p, fp = load_plan(plan, progress=progress, storage_options=storage_options)
    return destination(options, storage_options).finalize(options, p, fp, t0)
