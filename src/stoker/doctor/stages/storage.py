"""The storage stage: leave out (as corrupt) the sampled items that cannot be read, read the
rest cold and warm (a folder also from one packed file) and decide which figure the model
plans with. A set in object storage is read from the shard cache's copies; besides, one shard
is downloaded without the cache and the stage says whether the cache bounds the run."""

from __future__ import annotations

import contextlib
import os
import time

from stoker._core.errors import StokerFormatError
from stoker.doctor.findings import Findings, Storage
from stoker.doctor.measure.storage import (
    RemoteStorage,
    measure_read_files,
    measure_read_packed,
    measure_read_records,
    measure_remote,
    unreadable,
)
from stoker.doctor.measure.timing import Stage

__all__ = ["run"]


def run(f: Findings) -> None:
    """Fill ``f.storage``."""
    s, sample = f.settings, f.sample
    _drop_unreadable(f)
    read = measure_read_files if sample.kind == "folder" else measure_read_records
    cold, payloads = read(sample, seconds=s.step, cold=True)
    warm, _ = read(sample, seconds=s.half, cold=False, max_seconds=s.cap(s.half))
    f.stages += [cold, warm]
    packed: tuple[Stage, Stage] | None = None
    if sample.kind == "folder":
        directory = os.path.dirname(os.path.abspath(s.path.rstrip(os.sep)))
        packed = measure_read_packed(payloads, seconds=s.half, directory=directory)
        f.stages += list(packed)
    remote = _remote(f)
    use_cold = s.cache == "cold" or (s.cache == "auto" and not _fits(sample.total_bytes))
    note = _cache_note(s.cache, use_cold, sample.total_bytes, cold, warm)
    f.storage = Storage(cold, warm, packed, payloads, use_cold, note, remote)


def _remote(f: Findings) -> RemoteStorage | None:
    """For a set in object storage: one shard's download and the shard cache's verdict (the
    records above were read from the cache's copies); the set's size is then what the cache
    holds of it. ``None`` for a local set, or when the download fails (noted as not measured)."""
    s, sample = f.settings, f.sample
    if sample.records is None or sample.records.remote() is None:
        return None
    from stoker.formats.remote import RemoteOptions

    options = s.remote or RemoteOptions()
    try:
        remote = measure_remote(
            sample.records,
            shuffle=s.shuffle,
            window=s.window,
            prefetch_shards=options.prefetch_shards,
        )
    except OSError as e:
        f.skip("storage (download)", f"{type(e).__name__}: {e}")
        return None
    sample.total_bytes = remote.set_bytes
    # the sample's shards stay cached but unpinned: the loader runs need the cache's room
    sample.records.remote().let_go()
    if remote.skipped:
        f.skip("storage (download)", remote.skipped)
    return remote


def _drop_unreadable(f: Findings) -> None:
    """Record the sampled items that cannot be read as corrupt and take them out of the
    sample, so that every later stage works on what reads (the cold pass evicts the pages
    this check brought in before it reads)."""
    sample = f.sample
    bad, looked = unreadable(
        sample, time.perf_counter() + f.settings.left(f.settings.stage_end) / 3
    )
    if looked < sample.sampled:  # the budget's share for this pass ran out: a smaller sample
        del sample.files[looked:], sample.positions[looked:]
    if not bad:
        return
    if len(bad) == sample.sampled:  # nothing reads: an error of the set, not of its samples
        reasons = sorted({r for _, r in bad})
        raise StokerFormatError(
            f"{sample.path}: none of the {len(bad)} sampled samples could be read: "
            + "; ".join(reasons[:3])
            + (f"; and {len(reasons) - 3} other errors" if len(reasons) > 3 else "")
        )
    for j, reason in bad:
        key, where = sample.describe(j)
        f.found_corrupt(key, where, reason, "read")
    drop = {j for j, _ in bad}
    if sample.kind == "folder":
        sample.files = [p for j, p in enumerate(sample.files) if j not in drop]
    sample.positions = [p for j, p in enumerate(sample.positions) if j not in drop]


def _fits(total_bytes: int) -> bool:
    """Does the data fit in half of the free memory (so later epochs read the page cache)?"""
    with contextlib.suppress(Exception):
        import psutil

        return total_bytes <= 0.5 * psutil.virtual_memory().available
    return True


def _cache_note(cache: str, use_cold: bool, total_bytes: int, cold: Stage, warm: Stage) -> str:
    """Which read figure the model uses, and why."""
    if use_cold:
        note = (
            "cold (asked for)"
            if cache == "cold"
            else f"cold: the data ({total_bytes / 1e9:.1f} GB) does not fit in half the free memory"
        )
    else:
        note = (
            "warm (asked for)"
            if cache == "warm"
            else "warm: the data fits in memory, so after the first epoch it is read from the page cache"
        )
    if cold.rate > 0 and warm.rate > 0 and cold.per_sample_s < 1.25 * warm.per_sample_s:
        note += (
            "; cold and warm reads came out alike: the storage is memory-backed or the "
            "kernel kept the pages (cold figures are then optimistic)"
        )
    return note
