"""Access hints for shuffled reads of ``.rec`` files larger than the page cache.

A ``.rec`` is read through a read-only ``mmap``. A page fault on a page that is not cached
makes the kernel read around it: the device's read-ahead window (``read_ahead_kb``, 128 KiB
by default and often several MiB on virtual disks) centred on the page. For a file that fits
in memory that is a gift: the first shuffled epoch pulls the whole file in large reads. For a
file larger than the page cache it is ruinous: every miss reads a window of which one record
(5-50 KB) is used, and the window evicts pages that would have been hit.

When the data does not fit, a chunk of a batch (``RecordIOReader.reader(indices)``) is read
with two hints on each mapping it touches:

- ``MADV_RANDOM`` on the whole mapping: a miss reads only the pages it touches;
- ``MADV_WILLNEED`` on each record's byte range (records that touch merged into one range),
  before the first record is read: the kernel queues every read of the chunk at once and the
  records arrive in parallel instead of one synchronous miss after another.

Neither changes what is read (the records are byte-identical), only when and how much the
kernel fetches. ``MADV_RANDOM`` alone is worse than no hint (a 20 KB record then costs five
synchronous 4 KiB reads); together they pay. The rule, :meth:`AccessHints.decide`: hints are
on when the set's ``.rec`` bytes exceed :data:`HINT_FRACTION` of the page-cache budget
(:func:`~stoker._core.system.page_cache_budget`: ``MemAvailable``, capped by the cgroup's
memory limit less the memory the cgroup holds outside the page cache). A set that fits is read exactly as without
this module: no ``madvise`` call at all. The figures behind the rule are in
docs/loader.md, "Files larger than memory" (``bench/bench_bigfile.py``).

The decision is taken once per reader object and process (a loader worker decides for
itself, at its first chunk); :class:`AccessHints` overrides it (``mode=True``/``False``, or
an explicit ``budget``). A failed ``madvise`` is ignored: hints are advice, the reads that
follow are correct without them.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stoker._core.system import page_cache_budget

__all__ = [
    "HINT_FRACTION",
    "AccessHints",
    "advise_ranges",
    "page_cache_budget",
]

#: Hints go on when the data exceeds this fraction of the page-cache budget. The crossing
#: ``bench/bench_bigfile.py`` measures lies between data = 1.0x and 1.25x the budget (the
#: figures: docs/loader.md, "Files larger than memory"); 0.9 leans to "on" because a wrong
#: "off" costs far more than a wrong "on", and the memory free when a worker decides
#: shrinks once training runs.
HINT_FRACTION = 0.9

_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class AccessHints:
    """How a reader decides on access hints (see the module docstring).

    ``mode``: ``"auto"`` (on when the data exceeds ``fraction`` of ``budget``), ``True``
    (always) or ``False`` (never). ``budget``: the page-cache bytes to compare against;
    ``None`` measures it (:func:`page_cache_budget`) when the decision is taken.
    """

    mode: bool | Literal["auto"] = "auto"
    budget: int | None = None
    fraction: float = HINT_FRACTION

    def __post_init__(self) -> None:
        if self.mode not in (True, False, "auto"):
            raise ValueError(f"AccessHints mode must be True, False or 'auto', got {self.mode!r}")
        if self.budget is not None and (isinstance(self.budget, bool) or self.budget < 0):
            raise ValueError(f"AccessHints budget must be bytes >= 0 or None, got {self.budget!r}")
        if not self.fraction > 0:
            raise ValueError(f"AccessHints fraction must be > 0, got {self.fraction!r}")

    def decide(self, data_bytes: int) -> bool:
        """Whether a set of ``data_bytes`` is read with hints. ``"auto"`` without a
        measurable budget (no ``/proc/meminfo``) leaves them off."""
        if self.mode != "auto":
            return bool(self.mode)
        budget = self.budget if self.budget is not None else page_cache_budget()
        return budget is not None and data_bytes > self.fraction * budget


def advise_ranges(mm: Any, starts: np.ndarray, ends: np.ndarray) -> None:
    """``MADV_RANDOM`` on mapping ``mm``, then ``MADV_WILLNEED`` on the byte ranges
    ``[starts[k], ends[k])`` (page-aligned; ranges that touch are merged into one call)."""
    madvise = getattr(mm, "madvise", None)
    if madvise is None or not hasattr(mmap, "MADV_WILLNEED") or len(mm) == 0:
        return  # a platform without madvise reads as it always did
    try:
        madvise(mmap.MADV_RANDOM)
        if starts.shape[0] == 0:
            return
        first = np.asarray(starts, dtype=np.int64) // _PAGE * _PAGE
        last = np.minimum(np.asarray(ends, dtype=np.int64), len(mm))
        order = np.argsort(first, kind="stable")
        first, last = first[order], last[order]
        run_lo, run_hi = int(first[0]), int(last[0])
        for lo, hi in zip(first[1:].tolist(), last[1:].tolist(), strict=True):
            if lo <= run_hi:
                run_hi = max(run_hi, hi)
                continue
            if run_hi > run_lo:
                madvise(mmap.MADV_WILLNEED, run_lo, run_hi - run_lo)
            run_lo, run_hi = lo, hi
        if run_hi > run_lo:
            madvise(mmap.MADV_WILLNEED, run_lo, run_hi - run_lo)
    except (OSError, ValueError):
        return  # advice only: the reads that follow are correct without it
