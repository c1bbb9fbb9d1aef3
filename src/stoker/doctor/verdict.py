"""The doctor's model of the input pipeline, and the verdict drawn from it.

NOTE [ The throughput model ]
One worker turns a sample into an array in ``t = t_read + t_decode + t_augment`` seconds
(each measured in this process on the real data). Of ``t``, ``c`` seconds are CPU time, ``q``
seconds waiting in the run queue for a core (Linux ``schedstat``: other processes had it) and
``b = t - c - q`` seconds blocked (on storage, or asleep). The run-queue wait says how busy the
machine is: one runnable thread got a share ``s1 = c / (c + q)`` of a core, as if ``L`` other
runnable threads shared the ``C`` usable cores with it (``L = C / s1 - 1`` when ``q > 0``,
else 0). With ``k`` workers, each gets a share ``s_k = min(1, C / (L + k))`` of a core:

    predicted(k) = e * k / (b + c / s_k)

- on an idle machine (``L = 0``) this is ``k / t`` until ``k = C``, then tends to the CPU
  cap ``C / c``; blocked time (I/O, sleep) keeps scaling with more workers;
- ``e``: the loader's efficiency, ``measured(1) / predicted(1)`` from the one-worker run (the
  cost of moving indices and batch slots between processes); ``1`` when that was not measured;
- one process (the training process) receives every batch, spending ``m`` CPU seconds per
  sample (measured in the loader runs), so no worker count goes past ``s_k / m``:

    predicted(k) = min(e * k / (b + c / s_k), s_k / m)

The prediction assumes the machine stays as busy as it was while the stages were timed (``L``
holds). On a busy machine the other processes' demand changes while stoker runs, so each loader
run also measures how many of the ``C`` cores other processes (and a hypervisor's steal) took
over its window; with the ``F`` cores they left free, the same model for that run is

    given_load(k) = min(e_F * k / (b + c / f_k), f_k / m), f_k = min(1, F / k)

(``e_F`` calibrated on the one-worker run the same way, :func:`predict_free`). When the
measured rate is far from ``predicted(k)`` but close to ``given_load(k)``, the load explains
the gap; when it is far from both, something else does.

The run then delivers ``min(loader, host-to-device, model)`` samples/s; the expected GPU busy
share is ``min(1, min(loader, host-to-device) / model)`` (loading overlaps compute when the
loader prefetches). The stage that bounds the run is the smallest of the three; when it is the
loader, the verdict names the part of ``t`` (or of ``c`` when the cores are the cap) that is
largest: ``storage``, ``decode``, ``augment``, or ``loader`` (its own overhead).

Each change (:mod:`stoker.doctor.changes`) replaces one term (``t_read`` from the
packed-file read, ``t_decode`` from a decode at reduced size, ...), recomputes the prediction
at the same worker count and reports the gain; ranked by the rate the whole run would then
deliver.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

__all__ = [
    "Cost",
    "assumption",
    "Verdict",
    "calibrate",
    "core_share",
    "cpu_capped",
    "loader_overhead_s",
    "delivered",
    "headline",
    "load_gap",
    "predict",
    "predict_free",
    "verdict",
]


@dataclass(frozen=True)
class Cost:
    """Seconds one worker spends on one sample, by stage (wall and CPU time), and ``share``:
    the share of a core a runnable thread got while they were measured (``c / (c + q)``)."""

    read_s: float
    read_cpu_s: float
    decode_s: float
    decode_cpu_s: float
    augment_s: float
    augment_cpu_s: float
    share: float = 1.0
    main_cpu_s: float = 0.0  # the consuming process's CPU per sample (receiving batches)
    assemble_s: float = 0.0  # per-sample generator + write into the batch slot
    assemble_cpu_s: float = 0.0

    @property
    def queue_s(self) -> float:
        """Seconds per sample spent runnable but waiting for a core."""
        return self.cpu_s * (1.0 / self.share - 1.0) if self.share > 0 else 0.0

    @property
    def total_s(self) -> float:
        return self.read_s + self.decode_s + self.augment_s + self.assemble_s

    @property
    def cpu_s(self) -> float:
        return self.read_cpu_s + self.decode_cpu_s + self.augment_cpu_s + self.assemble_cpu_s

    @property
    def blocked_s(self) -> float:
        """Off the CPU and not waiting for it: storage I/O, sleeps."""
        return max(0.0, self.total_s - self.cpu_s - self.queue_s)

    @property
    def one_worker_rate(self) -> float:
        return 1.0 / self.total_s if self.total_s > 0 else math.inf

    def others(self, cores: float) -> float:
        """``L``: other runnable threads the run-queue wait implies (0 on an idle machine)."""
        if not 0.0 < self.share < 1.0:
            return 0.0
        return max(0.0, cores / self.share - 1.0)

    def to_dict(self) -> dict[str, float]:
        return {
            "read_ms": 1e3 * self.read_s,
            "decode_ms": 1e3 * self.decode_s,
            "augment_ms": 1e3 * self.augment_s,
            "assemble_ms": 1e3 * self.assemble_s,
            "total_ms": 1e3 * self.total_s,
            "cpu_ms": 1e3 * self.cpu_s,
            "queue_ms": 1e3 * self.queue_s,
            "core_share": self.share,
            "main_cpu_ms": 1e3 * self.main_cpu_s,
            "blocked_ms": 1e3 * self.blocked_s,
            "cpu_share": self.cpu_s / self.total_s if self.total_s > 0 else 0.0,
        }


def assumption(cost: Cost, cores: int) -> str:
    """What the prediction assumes about the rest of the machine (``L``), in words."""
    others = cost.others(cores)
    if others <= 0.05:
        return (
            f"an idle machine: all {cores} usable core(s) free for stoker (no wait for a core "
            "was seen while the stages were timed)"
        )
    return (
        f"the load seen while the stages were timed holds: {others:.1f} other runnable "
        f"thread(s) competing for the {cores} usable core(s) (from the measured wait for a core)"
    )


def core_share(cost: Cost, workers: int, *, cores: float) -> float:
    """``s_k``: the share of a core each of ``workers`` runnable workers gets."""
    return min(1.0, cores / (cost.others(cores) + workers))


def predict(cost: Cost, workers: int, *, cores: float, efficiency: float = 1.0) -> float:
    """Predicted loader samples/s with ``workers`` workers (see the module NOTE)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    share = core_share(cost, workers, cores=cores)
    per_sample = cost.blocked_s + cost.cpu_s / share
    rate = efficiency * workers / per_sample if per_sample > 0 else math.inf
    if cost.main_cpu_s > 0:  # one process receives every batch: a serial cap
        rate = min(rate, share / cost.main_cpu_s)
    return rate


def predict_free(cost: Cost, workers: int, *, free_cores: float, efficiency: float = 1.0) -> float:
    """Predicted loader samples/s with ``workers`` workers when ``free_cores`` cores were left
    free by other processes (measured during the run), in place of the load ``L`` seen while
    the stages were timed (see the module NOTE)."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    share = min(1.0, max(free_cores, 1e-3) / workers)
    per_sample = cost.blocked_s + cost.cpu_s / share
    rate = efficiency * workers / per_sample if per_sample > 0 else math.inf
    if cost.main_cpu_s > 0:
        rate = min(rate, share / cost.main_cpu_s)
    return rate


def cpu_capped(cost: Cost, workers: int, *, cores: int) -> bool:
    """True when the workers would mostly wait for a core (the cores are the cap)."""
    share = core_share(cost, workers, cores=cores)
    return share < 1.0 and cost.cpu_s / share - cost.cpu_s > cost.blocked_s


def calibrate(cost: Cost, measured_one_worker: float | None) -> float:
    """The loader's efficiency ``e`` from its one-worker rate (clipped to [0.05, 1.5])."""
    pred = predict(replace(cost, main_cpu_s=0.0), 1, cores=1) if cost.total_s > 0 else math.inf
    if not measured_one_worker or not math.isfinite(pred):
        return 1.0
    return min(1.5, max(0.05, measured_one_worker / pred))


def loader_overhead_s(cost: Cost, efficiency: float) -> float:
    """Seconds per sample the loader adds on top of ``t`` (0 when ``e >= 1``)."""
    return max(0.0, cost.total_s / efficiency - cost.total_s) if efficiency > 0 else 0.0


@dataclass(frozen=True)
class Verdict:
    bound: str  # storage | decode | augment | loader | host-to-device | model
    workers: int
    loader_rate: float
    h2d_rate: float | None
    model_rate: float | None
    delivered: float
    gpu_busy_share: float | None
    cpu_capped: bool
    shares: dict[str, float]  # part of the per-sample time (or CPU time) by loader stage
    text: str
    loader_basis: str = "measured"  # "measured" | "predicted": where loader_rate comes from
    #: False when the two largest parts' intervals overlap: the run cannot tell which is larger
    decided: bool = True
    #: the second-largest part of the loader's work (the one that may be the bound instead)
    runner_up: str | None = None
    #: ``{part: (lo, hi)}`` seconds per sample (CPU seconds when the cores are the cap)
    intervals: dict[str, tuple[float, float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        intervals = d.pop("intervals") or {}
        d["intervals_ms"] = {k: [1e3 * lo, 1e3 * hi] for k, (lo, hi) in intervals.items()}
        return d


def delivered(loader: float, h2d: float | None, model: float | None) -> float:
    return min(x for x in (loader, h2d, model) if x is not None)


def _supply(loader: float, h2d: float | None) -> float:
    return loader if h2d is None else min(loader, h2d)


def verdict(
    cost: Cost,
    *,
    workers: int,
    cores: int,
    efficiency: float,
    loader_rate: float | None = None,
    h2d_rate: float | None = None,
    model_rate: float | None = None,
    loader_basis: str | None = None,
    why_predicted: str = "not measured",
    spreads: dict[str, tuple[float, float]] | None = None,
    own_efficiency: float | None = None,
) -> Verdict:
    """Which stage bounds the run at ``workers`` workers, and the GPU busy share.

    ``loader_rate`` is the loader's rate at ``workers`` (the model's prediction when
    ``None``); ``loader_basis`` says whether it was measured (the default when a rate is
    given) or predicted; the text says so, with ``why_predicted``. ``spreads``: for each part
    of the loader's work (storage, decode, augment, loader), its measured interval as factors
    of its figure, ``(lo, hi)``; when the two largest parts' intervals overlap the verdict is
    not decided (``decided=False``) and names both. ``own_efficiency``: the efficiency the
    loader's own work is judged by (default ``efficiency``; the stage passes the one
    calibrated with the cores the one-worker run found free, so that other processes' load
    during that run is not blamed on the loader).
    """
    if loader_basis is None:
        loader_basis = "measured" if loader_rate is not None else "predicted"
    if loader_basis not in ("measured", "predicted"):
        raise ValueError(f"loader_basis must be 'measured' or 'predicted', got {loader_basis!r}")
    loader = (
        loader_rate
        if loader_rate is not None
        else predict(cost, workers, cores=cores, efficiency=efficiency)
    )
    capped = cpu_capped(cost, workers, cores=cores)
    own = efficiency if own_efficiency is None else own_efficiency
    parts = _loader_parts(cost, capped, loader_overhead_s(cost, own))
    whole = sum(parts.values()) or 1.0
    shares = {k: v / whole for k, v in parts.items()}
    ranked = sorted(parts, key=lambda k: -parts[k])
    inner, runner_up = ranked[0], ranked[1]
    factors = spreads or {}
    intervals = {
        k: (v * factors.get(k, (1.0, 1.0))[0], v * factors.get(k, (1.0, 1.0))[1])
        for k, v in parts.items()
    }
    decided = intervals[inner][0] > intervals[runner_up][1]
    candidates = {"loader": loader}
    if h2d_rate is not None:
        candidates["host-to-device"] = h2d_rate
    if model_rate is not None:
        candidates["model"] = model_rate
    outer = min(candidates, key=lambda k: candidates[k])
    busy = None if model_rate is None else min(1.0, _supply(loader, h2d_rate) / model_rate)
    lines = [_rates_line(workers, loader, h2d_rate, model_rate, loader_basis, why_predicted)]
    if outer == "model":
        lines.append(
            f"The model bounds the run: input keeps up with {loader / candidates['model']:.1f}x "
            f"headroom (expected GPU busy share {100 * (busy or 0):.0f} %). Speeding up the "
            "input will not help."
        )
    elif outer == "host-to-device":
        lines.append(
            f"The host-to-device copy bounds the run (expected GPU busy share "
            f"{100 * (busy or 0):.0f} %): send uint8 and normalise on the GPU, pin host memory, "
            "overlap copies with a side stream (stoker.torch.CudaPrefetcher)."
        )
    else:
        lines += _input_bound_lines(inner, shares[inner], capped, cores, busy)
        lines.insert(2, _base_line(cost, parts, capped))
        if not decided:
            lines.insert(2, _undecided_line(inner, runner_up, shares, intervals))
    return Verdict(
        inner if outer == "loader" else outer,
        workers,
        loader,
        h2d_rate,
        model_rate,
        candidates[outer],
        busy,
        capped,
        shares,
        " ".join(lines),
        loader_basis,
        decided or outer != "loader",
        runner_up,
        intervals,
    )


def _base_line(cost: Cost, parts: dict[str, float], capped: bool) -> str:
    """What the shares are of: one process's measured time plus what the loader adds."""
    whole = sum(parts.values())
    measured = cost.cpu_s if capped else cost.total_s
    added = whole - measured
    what = "CPU time" if capped else "time"
    if added <= 1e-3 * whole:
        return f"(Shares of {1e3 * whole:.3f} ms of {what} per sample, measured in one process.)"
    return (
        f"(Shares of {1e3 * whole:.3f} ms per sample: the {1e3 * measured:.3f} ms of {what} the "
        f"stages took in one process plus {1e3 * added:.3f} ms the loader adds, from its "
        "one-worker run, counted in its own work.)"
    )


def _undecided_line(
    inner: str,
    runner_up: str,
    shares: dict[str, float],
    intervals: dict[str, tuple[float, float]],
) -> str:
    """The verdict's words when the two largest parts cannot be told apart."""

    def one(k: str) -> str:
        lo, hi = intervals[k]
        name = _WHAT[k].split(" (")[0]
        return f"{name} ({100 * shares[k]:.0f} %, {1e3 * lo:.3f}-{1e3 * hi:.3f} ms)"

    return (
        f"Undecided: {one(inner)} and {one(runner_up)} overlap within their measured "
        "intervals, so either may be the larger; a longer run (--seconds) may separate them."
    )


#: a measured rate outside [_CLOSE, 1 / _CLOSE] of the model's figure is pointed out
_CLOSE = 0.75


def _off(measured: float, model: float) -> str | None:
    """ "41 % below" / "30 % above" when ``measured`` is far from ``model``, else None."""
    if model <= 0 or not math.isfinite(model):
        return None
    r = measured / model
    if _CLOSE <= r <= 1 / _CLOSE:
        return None
    return f"{100 * (1 - r):.0f} % below" if r < 1 else f"{100 * (r - 1):.0f} % above"


def load_gap(
    workers: int,
    measured: float,
    predicted: float,
    *,
    assumption: str,
    others_cores: float | None = None,
    cores: int | None = None,
    steal_cores: float = 0.0,
    load1: float | None = None,
    given_load: float | None = None,
) -> str | None:
    """What the verdict says when the measured rate at ``workers`` is far from the model's
    prediction: the prediction's assumption, what other processes took of the cores during
    that run, and whether the model with the cores they left (``given_load``) explains it.
    ``None`` when the two agree."""
    off = _off(measured, predicted)
    if off is None:
        return None
    text = (
        f"Measured with {workers} worker(s), the loader is {off} the prediction "
        f"({predicted:,.0f}/s), which assumes {assumption}."
    )
    if others_cores is None or cores is None or given_load is None:
        return text + (
            " The load during the run could not be measured: other processes taking the "
            "cores, memory bandwidth or the training process's own loop can each limit it."
        )
    free = max(0.0, cores - others_cores)
    text += (
        f" During that run other processes took {others_cores:.1f} of the {cores} usable "
        "core(s)"
        + (f" ({steal_cores:.1f} of it steal by the hypervisor)" if steal_cores >= 0.05 else "")
        + (f", load average {load1:.1f}" if load1 is not None else "")
        + f", leaving {free:.1f}; with those the model gives {given_load:,.0f}/s"
    )
    rest = _off(measured, given_load)
    if rest is None:
        return text + ": the machine's load explains the gap."
    return text + (
        f", and the measured rate is still {rest} that: the load does not explain it all; "
        "something else limits the loader (memory bandwidth, the training process's own loop)."
    )


_WHAT = {
    "storage": "reading the data from storage",
    "decode": "decoding images",
    "augment": "the augmentations",
    "loader": "the loader's own work (per-sample generators, batch slot writes, "
    "handing batches between processes)",
}


def _loader_parts(cost: Cost, capped: bool, overhead: float) -> dict[str, float]:
    """Seconds per sample by part of the loader's work: CPU time when the cores are the cap
    (waits overlap other workers' work), else wall time."""
    if capped:
        cpu_share = cost.cpu_s / cost.total_s if cost.total_s > 0 else 1.0
        return {
            "storage": cost.read_cpu_s,
            "decode": cost.decode_cpu_s,
            "augment": cost.augment_cpu_s,
            "loader": cost.assemble_cpu_s + overhead * cpu_share,
        }
    return {
        "storage": cost.read_s,
        "decode": cost.decode_s,
        "augment": cost.augment_s,
        "loader": cost.assemble_s + overhead,
    }


def _rates_line(
    workers: int,
    loader: float,
    h2d: float | None,
    model: float | None,
    basis: str,
    why_predicted: str,
) -> str:
    rate = (
        f"delivered {loader:,.0f} samples/s (measured)"
        if basis == "measured"
        else f"is predicted to deliver {loader:,.0f} samples/s (a prediction: {why_predicted})"
    )
    return (
        f"With {workers} worker(s), stoker's loader {rate}"
        + (f"; the copy to the GPU {h2d:,.0f}/s" if h2d is not None else "")
        + (f"; the model consumes {model:,.0f}/s" if model is not None else "")
        + "."
    )


def _input_bound_lines(
    inner: str, share: float, capped: bool, cores: int, busy: float | None
) -> list[str]:
    """What the verdict says when the loader bounds the run: its largest part, the GPU share."""
    how = "CPU time" if capped else "time"
    lines = [
        f"The input pipeline bounds the run; the largest part of its per-sample {how} is "
        f"{_WHAT[inner]} ({100 * share:.0f} %)"
        + (f", and the {cores} core(s) are the cap" if capped else "")
        + "."
    ]
    if busy is not None:
        lines.append(
            f"Expected GPU busy share: {100 * busy:.0f} % (the GPU waits for data the rest of the time)."
        )
    else:
        lines.append("Give --step-time or --model to compare with what the model consumes.")
    return lines


def headline(v: dict[str, Any]) -> str:
    """What bounds the run, in a few words; both parts when the verdict is undecided."""
    if v.get("decided", True) is False:
        return f"undecided: {v['bound']} or {v.get('runner_up')} bounds the run"
    return f"{v['bound']} bounds the run"
