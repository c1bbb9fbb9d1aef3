"""The system stage: check what in the machine's setup can starve or break the loader, with
the figures the earlier stages measured (the ring's size, the workers' threads and start
method)."""

from __future__ import annotations

from stoker.doctor import system as S
from stoker.doctor.findings import Findings
from stoker.doctor.measure.loader import estimated_slots

__all__ = ["run"]


def run(f: Findings) -> None:
    """Fill ``f.checks``."""
    s = f.settings
    runs = f.loader.runs
    last = runs[-1] if runs else None
    slots = last.slots if last else estimated_slots()
    sample_bytes = f.augment.sample_bytes
    f.checks = [
        S.check_memory(
            need_bytes=slots * s.batch_size * sample_bytes,
            what=f"a ring of {slots} batch slots of {s.batch_size} x {sample_bytes / 1e3:.0f} kB",
        ),
        S.check_ulimit(workers=s.workers_max),
        S.check_cores(workers=s.workers_max, cores=s.cores),
        S.check_threads(
            workers=s.workers_max,
            cores=s.cores,
            worker_threads=list(last.worker_threads) if last else None,
        ),
        S.check_start_method(
            loader_method=last.start_method if last else None,
            loader_engine=last.engine if last else None,
        ),
        S.check_load(cores=s.cores),
        S.check_node(),
    ]
