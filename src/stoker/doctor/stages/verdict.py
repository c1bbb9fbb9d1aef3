"""The verdict stage: judge the run at the best measured worker count (what a user would
pick), name the stage that bounds it and rank the changes by their gain."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from stoker.doctor.changes import recommend
from stoker.doctor.findings import Findings, Judgement
from stoker.doctor.measure.augment import transform_ops
from stoker.doctor.measure.timing import Stage
from stoker.doctor.stages.loader import free_efficiency
from stoker.doctor.verdict import (
    Verdict,
    assumption,
    load_gap,
    loader_overhead_s,
    predict,
    verdict,
)

__all__ = ["more_workers", "run", "still_rising"]

#: an op is worth naming when it takes this share of the augmentation time ...
_OP_SHARE = 0.25
#: ... and this share of the whole per-sample time
_OP_TOTAL_SHARE = 0.1
#: more workers are offered while each doubling gained at least this factor
_RISING = 1.1


def still_rising(measured: dict[int, float], k: int) -> bool:
    """Did the measured curve still climb at ``k`` (so more workers may help)? With no
    measurement, the model alone decides."""
    if not measured:
        return True
    if k != max(measured):
        return False
    below = [j for j in measured if j < k]
    return not below or measured[k] >= _RISING * measured[max(below)]


def more_workers(measured: dict[int, float], k: int, *, capped: bool) -> int | None:
    """The worker count the "more workers" change is judged at (twice ``k``), or ``None``
    when it cannot help: the measured curve stopped rising, or the cores are the cap at
    ``k`` (the verdict says so; more processes than cores then only share them)."""
    return 2 * k if still_rising(measured, k) and not capped else None


def run(f: Findings) -> None:
    """Fill ``f.judgement``."""
    s, cost, sweep = f.settings, f.cost, f.loader
    measured = sweep.measured
    k_run = max(measured, key=lambda k: (measured[k], -k)) if measured else s.workers_max
    loader_rate = sweep.predicted.get(k_run) or predict(
        cost, k_run, cores=s.cores, efficiency=sweep.efficiency
    )
    basis, why = "predicted", _why_predicted(f)
    if k_run in measured and not sweep.reads_warm:
        loader_rate, basis = measured[k_run], "measured"
    rates: dict[str, Any] = dict(
        workers=k_run,
        cores=s.cores,
        efficiency=sweep.efficiency,
        loader_rate=loader_rate,
        h2d_rate=f.h2d.result["rate"] if f.h2d.result else None,
        model_rate=f.model["rate"] if f.model else None,
    )
    own = _own_efficiency(f)
    spreads = _spreads(f, own)
    v = verdict(
        cost, **rates, loader_basis=basis, why_predicted=why, spreads=spreads, own_efficiency=own
    )
    v = _with_gap(f, v)
    normalize, costly = _augment_changes(f)
    recs = recommend(
        cost,
        **rates,
        packed_read=_per_sample(f.storage.packed_read),
        decode_scaled=_decode_scaled(f),
        resized=f.alternatives.resized,
        normalize=normalize,
        costly_op=costly,
        more_workers=more_workers(measured, k_run, capped=v.cpu_capped),
        spreads=spreads,
        trade=f.alternatives.trade,
    )
    noisy = [r for r in recs if r.gain_lo is not None and r.gain_lo <= 1.0]
    for r in noisy:
        f.skip(
            f"change: {r.action}",
            f"its gain to the loader (x{r.loader_gain:.2f}) is within the intervals of the "
            f"figures it compares (x{r.gain_lo:.2f} at worst), so it is not ranked",
        )
    ranked = [r for r in recs if r not in noisy]
    f.judgement = Judgement(k_run, loader_rate, _more_did_not_help(v, measured), ranked)


def _factors(stage: Stage | None) -> tuple[float, float]:
    """A stage's interval as factors of its figure."""
    if stage is None or stage.per_sample_s <= 0:
        return (1.0, 1.0)
    lo, hi = stage.interval_s
    return (lo / stage.per_sample_s, hi / stage.per_sample_s)


def _own_efficiency(f: Findings) -> float:
    """The efficiency the loader's own work is judged by: calibrated with the cores the
    one-worker run found free when its load was measured, else the plain one."""
    got = free_efficiency(f.cost, f.loader.runs)
    return f.loader.efficiency if got is None else got


def _spreads(f: Findings, own_efficiency: float) -> dict[str, tuple[float, float]]:
    """Each part of the loader's work as ``(lo, hi)`` factors of its figure: the stages'
    intervals, and for the loader's own work, the assemble step's with what the one-worker
    run's interval says the loader adds (its efficiency) at either end."""
    cost = f.cost
    out = {
        "storage": _factors(f.storage.read),
        "decode": _factors(f.decode.main),
        "augment": _factors(f.augment.stage),
    }
    assemble = next((st for st in f.stages if st.name.startswith("assemble")), None)
    a_lo, a_hi = _factors(assemble)
    one = next((r for r in f.loader.runs if r.workers == 1), None)
    added = loader_overhead_s(cost, own_efficiency)
    own = cost.assemble_s + added
    if one is None or own <= 0 or one.rate <= 0:
        out["loader"] = (a_lo, a_hi)
        return out
    r_lo, r_hi = one.rate_interval
    # the efficiency moves with the one-worker rate: e * r_x / r
    added_lo = loader_overhead_s(cost, own_efficiency * r_hi / one.rate)
    added_hi = loader_overhead_s(cost, own_efficiency * r_lo / one.rate)
    lo = (cost.assemble_s * a_lo + added_lo) / own
    hi = (cost.assemble_s * a_hi + added_hi) / own
    out["loader"] = (min(lo, 1.0), max(hi, 1.0))
    return out


def _why_predicted(f: Findings) -> str:
    """Why the verdict's loader figure is the model's rather than a measurement."""
    s, sweep = f.settings, f.loader
    if not s.run_loader:
        return "the loader runs were skipped (--no-loader, loader=False)"
    if sweep.reads_warm:
        return (
            "the loader runs read from the page cache; the plan is cold reads, so the model "
            "gives the figure"
        )
    failed = [x for x in f.not_measured if x["stage"].startswith("loader")]
    if failed:
        return f"the loader could not be measured here; see {failed[0]['stage']} under Not measured"
    return "the loader was not measured"


def _with_gap(f: Findings, v: Verdict) -> Verdict:
    """Add to the text when a measured rate is far from the prediction (the run farthest from
    it): the prediction's assumption, the load during that run and whether it explains the
    gap."""
    sweep = f.loader
    runs = [r for r in sweep.runs if r.rate > 0 and sweep.predicted.get(r.workers)]
    if not runs:
        return v
    run = max(runs, key=lambda r: abs(math.log(r.rate / sweep.predicted[r.workers])))
    load = run.load
    text = load_gap(
        run.workers,
        run.rate,
        sweep.predicted[run.workers],
        assumption=assumption(f.cost, f.settings.cores),
        others_cores=load.others_cores if load else None,
        cores=load.cores if load else None,
        steal_cores=load.steal_cores if load else 0.0,
        load1=load.load1 if load else None,
        given_load=sweep.given_load.get(run.workers),
    )
    return v if text is None else replace(v, text=f"{v.text} {text}")


def _more_did_not_help(v: Verdict, measured: dict[int, float]) -> Verdict:
    """Add to the text when the best count is below the largest one measured."""
    if not measured or v.workers >= max(measured):
        return v
    k_top = max(measured)
    return replace(
        v,
        text=v.text
        + f" More workers did not help here: {k_top} gave {measured[k_top]:,.0f} samples/s"
        f" (more busy processes than free cores: see the load and cores checks).",
    )


def _per_sample(stage: Stage | None) -> tuple[float, float, float] | None:
    return (stage.per_sample_s, stage.cpu_per_sample_s, stage.interval_s[1]) if stage else None


def _decode_scaled(f: Findings) -> tuple[float, float, str, float] | None:
    st = f.alternatives.scaled
    return (st.per_sample_s, st.cpu_per_sample_s, st.name, st.interval_s[1]) if st else None


def _augment_changes(
    f: Findings,
) -> tuple[tuple[float, float, float | None] | None, tuple[str, float, float, float] | None]:
    """The figures for moving a final ``Normalize`` to the GPU (its wall and CPU s/sample, the
    uint8 copy rate) and for the costliest op (name, wall, CPU, share of the augmentation)."""
    aug, cost, t = f.augment, f.cost, f.settings.transforms
    u8 = f.h2d.uint8_rate
    if aug.stage is None:
        return None, None
    if not aug.breakdown:
        if aug.out_dtype != "uint8" and type(t).__name__ == "Normalize":
            return (aug.stage.per_sample_s, aug.stage.cpu_per_sample_s, u8), None
        if cost.total_s > 0 and aug.stage.per_sample_s / cost.total_s >= _OP_SHARE:
            # one opaque transform: estimate what halving its cost would give
            label = f.settings.transforms_label
            half = (aug.stage.per_sample_s / 2, aug.stage.cpu_per_sample_s / 2)
            return None, (label, half[0], half[1], 1.0)
        return None, None
    normalize = None
    total_ops = sum(w for _, w, _ in aug.breakdown) or 1.0
    candidates = list(aug.breakdown)
    if type(transform_ops(t)[-1]).__name__ == "Normalize" and aug.out_dtype != "uint8":
        normalize = (aug.breakdown[-1][1], aug.breakdown[-1][2], u8)
        candidates = candidates[:-1]  # offered as "uint8 + GPU normalisation"
    costly = None
    if candidates:
        name, w, c = max(candidates, key=lambda x: x[1])
        if w / total_ops >= _OP_SHARE and cost.total_s > 0 and w / cost.total_s >= _OP_TOTAL_SHARE:
            costly = (name, w, c, w / total_ops)
    return normalize, costly
