"""One run of a loader configuration in a child process: the ranks in lockstep, a digest of
every delivered sample in a log, the state saved every few steps as a checkpoint would be.

The log is a flat array of :data:`RECORD` rows (fixed binary layout, no pickle), one per
delivered sample in delivery order: step by step, rank by rank, row by row. The checkpoint
is a JSON file written as ``*.partial`` and renamed: ``{"step", "records", "world_size",
"epoch", "batch", "state"}``, where ``records`` counts the log rows flushed before the state
was taken, so that the parent keeps exactly the samples that the saved state has delivered.

The child tells the parent each step it has finished over a pipe (``("step", n)``); the parent
SIGKILLs it at its chosen step, so a kill lands wherever the child then is: between batches,
inside a worker's chunk, or in the middle of writing the next checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._core.atomic import write_bytes_atomic

__all__ = ["RECORD", "Segment", "digest_batch", "read_log", "run_segment"]

#: One delivered sample: where it was delivered (epoch, rank, world size, batch, row), which
#: sample it is (index, key) and two 16-byte digests (SHA-256, cut): its image rows, and its label
#: with every carried field.
RECORD = np.dtype(
    [
        ("epoch", "<i8"),
        ("rank", "<i4"),
        ("world", "<i4"),
        ("batch", "<i8"),
        ("row", "<i8"),
        ("index", "<i8"),
        ("key", "<i8"),
        ("pixels", "V16"),
        ("fields", "V16"),
    ]
)


@dataclass(frozen=True)
class Segment:
    """What one child runs: ``factory(rank=r, world_size=world_size)`` for every rank, resumed
    from the checkpoint at ``resume_from`` (or from the start), until ``epochs`` epochs are
    delivered or the run reaches step ``stop`` (``None``: no bound; with ``whole_epochs``, the
    epoch in progress at that step is finished); every ``save_every`` steps (0: never) the
    checkpoint at ``checkpoint``."""

    factory: Callable[..., Any]
    world_size: int
    epochs: int
    log: str
    checkpoint: str
    save_every: int
    resume_from: str | None = None
    stop: int | None = None
    whole_epochs: bool = False


def _digest(*parts: Any) -> bytes:
    h = hashlib.sha256()  # hardware-accelerated where the CPU has SHA instructions
    for p in parts:
        h.update(np.ascontiguousarray(p).data)
    return h.digest()[:16]


def digest_batch(batch: Any, rank: int, world: int) -> np.ndarray:
    """The :data:`RECORD` rows of one batch. With ``pair_with`` a sample's two image rows
    (``i`` and ``i + n``) are one digest."""
    indices = np.asarray(batch.indices)
    n = len(indices)
    images = np.asarray(batch.images)
    paired = len(images) == 2 * n
    labels = np.asarray(batch.labels)
    names = sorted(batch.fields)
    out = np.zeros(n, RECORD)
    out["epoch"], out["rank"], out["world"] = batch.epoch, rank, world
    out["batch"], out["row"] = batch.number, np.arange(n)
    out["index"], out["key"] = indices, np.asarray(batch.keys)[:n]
    for i in range(n):
        pix = (images[i], images[i + n]) if paired else (images[i],)
        out["pixels"][i] = _digest(*pix)
        extra = [batch.fields[k][i] for k in names] + [
            batch.lengths[k][i] for k in sorted(batch.lengths)
        ]
        out["fields"][i] = _digest(labels[i : i + 1], *extra)
    return out


def read_log(path: str, records: int | None = None) -> np.ndarray:
    """The first ``records`` rows of a log (all of them when ``None``)."""
    if not os.path.exists(path):
        return np.zeros(0, RECORD)
    data = np.fromfile(path, dtype=np.uint8)
    whole = len(data) // RECORD.itemsize  # a row cut short by a kill is not a row
    rows = data[: whole * RECORD.itemsize].view(RECORD)
    return rows if records is None else rows[:records]


def run_segment(job: Segment, conn: Any) -> None:
    """The child's body; reports ``("start", info)``, ``("step", n)`` per step, then
    ``("done", info)`` or ``("error", (the error in one line, its traceback))``."""
    try:
        _run(job, conn)
    except BaseException as e:  # noqa: BLE001 - every failure goes to the parent, named
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        conn.send(("error", (" ".join(f"{type(e).__name__}: {e}".split()), text)))
    finally:
        conn.close()


def _run(job: Segment, conn: Any) -> None:
    saved = None
    if job.resume_from is not None:
        with open(job.resume_from, encoding="utf-8") as f:
            saved = json.load(f)
    loaders: list[Any] = []
    try:
        for r in range(job.world_size):  # one by one: a failing rank closes those made
            loaders.append(job.factory(rank=r, world_size=job.world_size))
        if saved is not None:
            for ld in loaders:
                ld.load_state_dict(saved["state"])
        first = loaders[0]
        conn.send(
            (
                "start",
                {
                    "epoch": first.epoch,
                    "batches": len(first),
                    "batch_size": first.batch_size,
                    "drop_last": bool(getattr(first, "drop_last", False)),
                },
            )
        )
        step = saved["step"] if saved is not None else 0
        records = 0
        with open(job.log, "wb") as log:
            while first.epoch < job.epochs and (job.stop is None or step < job.stop):
                step, records = _epoch(job, loaders, log, conn, step, records)
        conn.send(("done", {"step": step, "records": records}))
    finally:
        for ld in loaders:
            ld.close()


def _epoch(
    job: Segment, loaders: list[Any], log: Any, conn: Any, step: int, records: int
) -> tuple[int, int]:
    """One pass of every rank, in lockstep: a step is one batch of each rank."""
    its = [iter(ld) for ld in loaders]
    while job.stop is None or job.whole_epochs or step < job.stop:
        batches = [next(it, None) for it in its]
        ended = [b is None for b in batches]
        if all(ended):
            return step, records
        if any(ended):
            short = [r for r, e in enumerate(ended) if e]
            raise RuntimeError(
                f"ranks {short} of {job.world_size} ended the epoch at step {step} while the "
                "others went on: a data-parallel job would hang there"
            )
        rows = np.concatenate([digest_batch(b, r, job.world_size) for r, b in enumerate(batches)])
        log.write(rows.tobytes())
        records += len(rows)
        step += 1
        if job.save_every and step % job.save_every == 0:
            log.flush()  # the rows the state has delivered reach the file before the state
            state = loaders[0].state_dict()  # rank 0's state stands for every rank
            ckpt = {
                "step": step,
                "records": records,
                "world_size": job.world_size,
                "epoch": state.get("epoch"),
                "batch": state.get("batch"),
                "state": state,
            }
            write_bytes_atomic(job.checkpoint, json.dumps(ckpt).encode())
        conn.send(("step", step))
    return step, records
