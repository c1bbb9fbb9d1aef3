"""The loader stage: run ``stoker.Loader`` at 1..N workers, calibrate the throughput model on
the one-worker run and predict every worker count; for each run, also the model with the
cores other processes left free during it. Samples a run skipped are recorded as corrupt."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace

from stoker.doctor.findings import Findings, LoaderSweep
from stoker.doctor.measure.loader import LoaderRun, TooFewBatches, loader_source, measure_loader
from stoker.doctor.verdict import Cost, calibrate, predict, predict_free

__all__ = ["run", "worker_counts"]

#: the loader reads through the page cache when its one-worker rate beats the cold figure by this
_WARM_MARGIN = 1.1


def worker_counts(n: int) -> list[int]:
    """1, 2, ..., n for n <= 4; then powers of two and n (to bound the run time)."""
    if n <= 4:
        return list(range(1, n + 1))
    ks = [1, 2]
    while ks[-1] * 2 < n:
        ks.append(ks[-1] * 2)
    ks.append(n)
    return ks


def run(f: Findings, step: Callable[[str], None]) -> None:
    """Fill ``f.loader`` and add the consuming process's CPU to ``f.cost``; ``step`` is called
    after each worker count."""
    s = f.settings
    runs = _sweep(f, step) if s.run_loader else []
    if not s.run_loader:
        f.skip("loader", "skipped on request; rates are predictions")
    measured = {r.workers: r.rate for r in runs}
    cost = f.cost
    # e comes from the one-worker run; the loader reads through the page cache when the
    # doctor's own reads have just warmed it, so a loader faster than the cold figure
    # allows is calibrated against the warm one
    warm = f.storage.warm
    cost_warm = replace(cost, read_s=warm.per_sample_s, read_cpu_s=warm.cpu_per_sample_s)
    m1 = measured.get(1)
    mains = [r.main_cpu_per_sample_s for r in runs if r.workers == 1]
    if mains:
        cost = replace(cost, main_cpu_s=mains[0])
    reads_warm = f.storage.use_cold and m1 is not None and m1 * cost.total_s > _WARM_MARGIN
    eff = calibrate(cost_warm if reads_warm else cost, m1)
    pred_ks = sorted(set(s.workers) | {2 * s.workers_max})
    predicted = {k: predict(cost, k, cores=s.cores, efficiency=eff) for k in pred_ks}
    ran = replace(cost_warm, main_cpu_s=cost.main_cpu_s) if reads_warm else cost
    f.cost = cost
    f.loader = LoaderSweep(runs, eff, predicted, reads_warm, _given_load(ran, runs))
    for r in runs:
        for x in r.skipped:
            f.found_corrupt(x["key"], x["where"], x["reason"], "loader")


def free_efficiency(cost: Cost, runs: list[LoaderRun]) -> float | None:
    """The loader's efficiency calibrated on the one-worker run with the cores that run found
    free (``None`` without a one-worker run whose load was measured): what the loader itself
    costs, with the machine's load during that run taken out."""
    one = next((r for r in runs if r.workers == 1 and r.load is not None and r.rate > 0), None)
    if one is None or one.load is None:
        return None
    bare = replace(cost, main_cpu_s=0.0)
    base = predict_free(bare, 1, free_cores=one.load.free_cores)
    return min(1.5, max(0.05, one.rate / base)) if base > 0 else 1.0


def _given_load(cost: Cost, runs: list[LoaderRun]) -> dict[int, float]:
    """For each run whose load was measured: the model with the cores left free during that
    run, calibrated the same way on the one-worker run (the one-worker figure is then the
    measured one by construction)."""
    eff = free_efficiency(cost, runs)
    if eff is None:
        return {}
    return {
        r.workers: predict_free(cost, r.workers, free_cores=r.load.free_cores, efficiency=eff)
        for r in runs
        if r.load is not None
    }


def _needs(f: Findings, k: int, runs: list[LoaderRun]) -> float:
    """About how long a run at ``k`` workers takes: its start-up (the last run's, else 0.15 s),
    ``2k + 5`` batches at the last run's rate (else one process's) and its least window."""
    rate = runs[-1].rate if runs else f.cost.one_worker_rate
    startup = runs[-1].startup_s if runs else 0.15
    return startup + (2 * k + 5) * f.settings.batch_size / max(rate, 1e-9) + f.settings.step


def _sweep(f: Findings, step: Callable[[str], None]) -> list[LoaderRun]:
    """The loader at each worker count, on one source object; stops at the first failure."""
    s = f.settings
    runs: list[LoaderRun] = []
    src_obj, owned = loader_source(
        [s.path, *s.mix_with] if s.mix_with else s.path, s.remote, s.weights
    )
    try:
        for n, k in enumerate(s.workers):
            stop = s.deadline - 0.05 - 0.02 * k  # room to stop its workers
            if stop - time.perf_counter() < _needs(f, k, runs):
                f.cut(*(f"loader ({j} workers)" for j in s.workers[n:]))
                break
            try:
                runs.append(
                    measure_loader(
                        src_obj,
                        workers=k,
                        batch_size=s.batch_size,
                        transforms=s.transforms,
                        seconds=s.step,
                        cores=s.cores,
                        max_seconds=s.cap(s.step),
                        deadline=stop,
                    )
                )
            except Exception as e:  # noqa: BLE001 - report, do not crash
                for x in getattr(e, "skipped", ()):  # a run that failed may still name them
                    f.found_corrupt(x["key"], x["where"], x["reason"], "loader")
                if isinstance(e, TooFewBatches) and time.perf_counter() >= stop:
                    f.cut(*(f"loader ({j} workers)" for j in s.workers[n:]))
                    break
                reason = (
                    f"stoker.Loader is not available ({e})"
                    if isinstance(e, ImportError)
                    else f"{type(e).__name__}: {e}"
                )
                f.skip(f"loader ({k} workers)", reason)
                break
            finally:
                step(f"loader {k}")
    finally:
        if owned:
            with contextlib.suppress(Exception):
                src_obj.close()
    return runs
