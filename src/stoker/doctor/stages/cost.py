"""The cost stage: time the batch-slot write and sum the stages into one worker's per-sample
:class:`~stoker.doctor.verdict.Cost`."""

from __future__ import annotations

from stoker.doctor.findings import Findings
from stoker.doctor.measure.augment import measure_assemble
from stoker.doctor.measure.timing import Stage
from stoker.doctor.verdict import Cost

__all__ = ["core_share", "run"]


def core_share(stages: list[Stage]) -> float:
    """The share of a core this thread got while runnable, over the stages of the pipeline."""
    cpu = sum(st.cpu_seconds for st in stages)
    queued = sum(st.queue_seconds for st in stages)
    return cpu / (cpu + queued) if cpu + queued > 0 else 1.0


def run(f: Findings) -> None:
    """Fill ``f.cost`` (the consuming process's CPU comes later, from the loader runs)."""
    s = f.settings
    assemble = f.add(
        measure_assemble(
            f.augment.outputs,
            batch_size=s.batch_size,
            seconds=s.quarter,
            max_seconds=s.cap(s.quarter),
        )
    )
    read, dec, aug = f.storage.read, f.decode.main, f.augment.stage
    used = [st for st in (read, dec, aug, assemble) if st is not None]
    f.cost = Cost(
        read.per_sample_s,
        read.cpu_per_sample_s,
        dec.per_sample_s if dec else 0.0,
        dec.cpu_per_sample_s if dec else 0.0,
        aug.per_sample_s if aug else 0.0,
        aug.cpu_per_sample_s if aug else 0.0,
        core_share(used),
        assemble_s=assemble.per_sample_s if assemble else 0.0,
        assemble_cpu_s=assemble.cpu_per_sample_s if assemble else 0.0,
    )
