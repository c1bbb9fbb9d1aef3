"""One shard job: the piece every engine and destination shares, below them (see
``steps.py``'s NOTE for the protocol, ``engines/jobs.py`` for the engines).

:func:`run_shard` writes shard ``s`` of a plan into its final files (each ``*.partial``, then
renamed) and then its side-car ``OUT-NNNNN.pack-shard.json``, the shard's commit point, under
an exclusive lock on ``OUT-NNNNN.pack-shard.lock``; a shard whose side-car is of this plan and
whose files have its sizes and verify is done and skipped, any other state is written again
from scratch, to the same bytes. The finalize after all of them is ``commit/setfiles.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np

from stoker._core.atomic import atomic_write
from stoker._core.errors import TooManyRejectsError
from stoker._core.oscompat import OWN_FILE, lock
from stoker._core.progress import Progress
from stoker.pack.plan.listing import ListingItem
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.plan import Plan, geometric
from stoker.pack.run.outputs import (
    OutputPaths,
    ShardWriters,
    Unstorable,
    WriteFailed,
    write_rejects,
)
from stoker.pack.run.pool import Pool, results
from stoker.pack.run.records import convert_range, reject_detail, sample_of
from stoker.pack.run.report import ShardCounts
from stoker.pack.run.worker import process

__all__ = [
    "ShardOutcome",
    "forget_shards",
    "lock_path",
    "output_paths",
    "parse_sidecar",
    "read_sidecar",
    "run_shard",
    "shard_bounds",
    "shard_lock",
    "shard_problem",
    "sidecar_path",
]

_SIDECAR_VERSION = 2


def sidecar_path(paths: OutputPaths, s: int) -> str:
    """Shard ``s``'s side-car: ``OUT-NNNNN.pack-shard.json`` (``OUT.pack-shard.json``)."""
    sid = paths.shard_ids[s]
    stem = paths.prefix if sid is None else f"{paths.prefix}-{sid:05d}"
    return stem + ".pack-shard.json"


def forget_shards(options: PackOptions, plan: Plan, *, journal: str | None = None) -> bool:
    """Remove every shard's side-car: each shard is then packed again. ``journal``: only when
    no shard has one and no shard file is final (a stop between a shard's rename and its
    side-car leaves files a rerun of this plan replaces), remove the run's journal at that
    path and the shards' lock files too; whether it did."""
    paths = output_paths(options, plan)
    sides = [sidecar_path(paths, s) for s in range(plan.n_shards)]
    if journal is not None:
        if any(os.path.exists(p) for p in sides) or paths.shard_files():
            return False
        sides += [journal, *(lock_path(paths, s) for s in range(plan.n_shards))]
    for p in sides:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
    return True


# ---------------------------------------------------------------- one shard
@dataclass(frozen=True)
class ShardOutcome:
    """What one shard job did: ``skipped`` (it was done and verified) or packed, and the
    positions it covers, records written and rejects."""

    shard: int
    skipped: bool
    positions: int
    written: int
    rejected: int
    seconds: float


def read_sidecar(path: str) -> dict | None:
    """The side-car at ``path``; ``None`` when there is none or it is not one."""
    try:
        with open(path, "rb") as f:
            return parse_sidecar(f.read())
    except OSError:
        return None


def parse_sidecar(data: bytes) -> dict | None:
    """A side-car's JSON; ``None`` when ``data`` is not one of this version."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("stoker_shard") == _SIDECAR_VERSION else None


def shard_problem(
    options: PackOptions, plan: Plan, fp: str, s: int, *, check: bool = True
) -> str | None:
    """Why shard ``s`` is not done (``None``: it is): no side-car of this plan, a file
    missing or of another size, or (``check``) a record whose framing or CRC is wrong."""
    paths = output_paths(options, plan)
    side_path = sidecar_path(paths, s)
    side = read_sidecar(side_path)
    if side is None:
        return f"not packed ({os.path.basename(side_path)} is missing)"
    if side.get("fingerprint") != fp or side.get("shard") != s:
        return f"packed from another plan ({os.path.basename(side_path)})"
    folder = os.path.dirname(os.path.abspath(paths.prefix))
    files = side.get("files") or {}
    for name, size in files.items():
        p = os.path.join(folder, name)
        try:
            got = os.path.getsize(p)
        except OSError:
            return f"{p} is missing"
        if got != size:
            return f"{p} is {got} bytes, the shard job wrote {size}"
    if check and files:
        from stoker.formats.registry import get

        main = os.path.join(folder, str(side.get("main")))
        report = get(options.format).load("verify")(main, max_problems=1, progress=False)
        if not report.ok:
            first = report.problems[0] if report.problems else "it does not verify"
            return f"{first}"
    return None


def _inline(plan: Plan, a: int, b: int, options: PackOptions, upright: bool) -> Generator:
    """Each item's result, checked in this process (a Ray task holds one CPU)."""
    from PIL import Image, ImageFile

    Image.MAX_IMAGE_PIXELS = None  # check_image applies max_pixels from the header itself
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    for i, it in enumerate(plan.items[a:b], a):
        masks = it.masks if isinstance(it, ListingItem) else ()
        yield i, process(it.path, options, masks, upright=upright)


def _stream(options: PackOptions, plan: Plan, a: int, b: int, pool: Pool | None) -> Generator:
    upright = plan.schema is not None and geometric(plan.schema)
    if pool is None:
        yield from _inline(plan, a, b, options, upright)
        return
    for pos, r in results(plan.items[a:b], options, pool, upright=upright):
        yield a + pos, r


def run_shard(
    options: PackOptions,
    plan: Plan,
    fp: str,
    s: int,
    *,
    pool: Pool | None = None,
    bar: Progress | None = None,
    lock: bool = True,
) -> ShardOutcome:
    """Pack shard ``s`` of ``plan`` unless it is done (see the module NOTE); ``pool``: the
    local pool whose workers check the images (``None``: this process does); ``bar``:
    advanced by each position done, or by all of them when the shard is done already;
    ``lock=False``: the caller holds the shard's lock (:func:`lock_path`)."""
    if not lock:
        return _run_shard(options, plan, fp, s, pool, bar)
    with shard_lock(lock_path(output_paths(options, plan), s)):
        return _run_shard(options, plan, fp, s, pool, bar)


def lock_path(paths: OutputPaths, s: int) -> str:
    """Shard ``s``'s lock file, beside its side-car."""
    return sidecar_path(paths, s)[: -len(".json")] + ".lock"


@contextlib.contextmanager
def shard_lock(path: str) -> Generator[None, None, None]:
    """Hold an exclusive lock on ``path`` (made when missing): one job at a time per shard
    (the task of a driver that was killed may still be running when a rerun's starts; the
    lock goes with its process)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | OWN_FILE, 0o644)
    try:
        lock(fd)
        yield
    finally:
        os.close(fd)


def _run_shard(
    options: PackOptions, plan: Plan, fp: str, s: int, pool: Pool | None, bar: Progress | None
) -> ShardOutcome:
    t0 = time.perf_counter()
    a, b = shard_bounds(plan, s)
    if shard_problem(options, plan, fp, s) is None:
        if bar is not None:
            bar.update(b - a)
        return ShardOutcome(s, True, b - a, 0, 0, time.perf_counter() - t0)
    paths = output_paths(options, plan)
    side_path = sidecar_path(paths, s)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(side_path)
    writers = ShardWriters(paths, plan.writer_schema)
    counts = ShardCounts()
    rejects: list[list] = []
    lengths: dict[str, int] = {}
    stream = None
    try:
        if plan.reader is not None:  # a convert: read and written in this process
            convert_range(plan, a, b, s, writers, counts, rejects, lengths, bar)
        else:
            stream = _stream(options, plan, a, b, pool)
            _store(plan, s, stream, writers, counts, rejects, bar)
            if options.layout != "plain":
                _write_layout(options, plan, paths, writers, rejects)
        nbytes = int(writers.get(s).bytes_written)
        entry, files = writers.commit_one(s)
    except WriteFailed as e:
        writers.abort()
        raise e.error from None
    except BaseException:
        with contextlib.suppress(Exception):
            writers.abort()  # a partial shard is packed again from scratch
        raise
    finally:
        if stream is not None:
            stream.close()
    side = {
        "stoker_shard": _SIDECAR_VERSION,
        "fingerprint": fp,
        "shard": s,
        "positions": [a, b],
        "entry": entry,
        "bytes": nbytes,
        "files": {os.path.basename(p): os.path.getsize(p) for p in files},
        "main": os.path.basename(files[0]),
        "counts": counts.to_json(),
        "rejects": rejects,
        "lengths": lengths,  # a convert's longest variable fields (finalize takes the max)
    }
    with atomic_write(side_path, "w") as f:
        json.dump(side, f)  # key order kept: the entry goes into the manifest as it is
    return ShardOutcome(s, False, b - a, counts.n, len(rejects), time.perf_counter() - t0)


def _store(
    plan: Plan,
    s: int,
    stream: Generator,
    writers: ShardWriters,
    counts: ShardCounts,
    rejects: list[list],
    bar: Progress | None,
) -> None:
    """Write the checked files' results of ``stream`` into shard ``s`` in position order."""
    for pos, r in stream:
        if r[0] == 0:
            key, data, label, fields = sample_of(plan, pos, r)
            try:
                writers.write(s, key, data, label, fields)
            except Unstorable as e:
                r = (1, "unstorable", str(e))
            else:
                _, _, fmt, rotated, passthrough, size_in = r[:6]
                counts.add(pos, fmt, bool(rotated), bool(passthrough), int(size_in))
        if r[0] == 1:
            rejects.append([pos, r[1], reject_detail(plan, pos, r[2])])
        if bar is not None:
            bar.update(1)


def _write_layout(
    options: PackOptions, plan: Plan, paths: OutputPaths, writers: ShardWriters, rejects: list
) -> None:
    """Append the layout's records after the images of the one shard; a reject stops the
    run first (an insightface identity's range has no gaps), with the rejects list written."""
    if rejects:
        item_rejects = [(int(p), str(r), str(d)) for p, r, d in rejects]
        write_rejects(paths.rejects, plan.scan, plan, item_rejects)
        raise TooManyRejectsError(
            f"{len(rejects)} files rejected, an insightface layout keeps every image (an "
            f"identity's range has no gaps); see {paths.rejects} (nothing committed)"
        )
    labels = np.asarray([float(it.label) for it in plan.items])  # type: ignore[arg-type]
    writers.write_layout(options.layout, labels)


def output_paths(options: PackOptions, plan: Plan) -> OutputPaths:
    """Where the run of ``options`` writes, under the plan's prefix."""
    return OutputPaths.for_plan(plan, list_file=options.list_file, format=options.format)


def shard_bounds(plan: Plan, s: int) -> tuple[int, int]:
    """The positions ``[a, b)`` shard ``s`` of ``plan`` holds."""
    n = len(plan.items)
    if plan.shard_size is None:
        return 0, n
    return min(n, s * plan.shard_size), min(n, (s + 1) * plan.shard_size)
