"""The changes the doctor offers: each one term of the throughput model replaced by a measured
figure, re-predicted at the same worker count and ranked by what the whole run would deliver
(see the NOTE in :mod:`stoker.doctor.verdict`). Each says whether it changes what the model
sees (a trade); one whose figures have intervals, the loader's gain at their least
favourable ends (``gain_lo``): at or below 1, it is not ranked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from stoker.doctor.verdict import Cost, delivered, predict

__all__ = ["Recommendation", "rank", "recommend"]

#: a faster decode (or decode + augment) is offered when it saves at least 10 %
_WORTH = 0.9
#: more workers are offered when the prediction gains at least 5 %
_MORE_WORKERS_GAIN = 1.05


@dataclass(frozen=True)
class Recommendation:
    action: str  # short imperative
    detail: str  # the figures behind it
    loader_before: float
    loader_after: float
    delivered_before: float
    delivered_after: float
    basis: str  # "measured" | "estimated"
    changes_data: bool = False  # a trade: the model sees other data (fewer pixels, no op)
    gain_lo: float | None = None  # the loader's gain at the intervals' least favourable ends

    @property
    def gain(self) -> float:
        """End-to-end: samples/s the run delivers after / before."""
        return self.delivered_after / self.delivered_before if self.delivered_before > 0 else 1.0

    @property
    def loader_gain(self) -> float:
        return self.loader_after / self.loader_before if self.loader_before > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "loader_gain": self.loader_gain, "gain": self.gain}


def rank(recs: list[Recommendation]) -> list[Recommendation]:
    """Best first: by what the whole run delivers, then by the loader's own gain."""
    return sorted(recs, key=lambda r: (-r.gain, -r.loader_gain, r.action))


@dataclass(frozen=True)
class _Baseline:
    """The run as measured at ``workers``; predictions are scaled to its measured rate."""

    cost: Cost
    workers: int
    cores: int
    efficiency: float
    loader_rate: float
    h2d_rate: float | None
    model_rate: float | None
    spreads: dict[str, tuple[float, float]]  # {storage, decode, augment: (lo, hi) factors}

    @property
    def before(self) -> float:
        return delivered(self.loader_rate, self.h2d_rate, self.model_rate)

    @property
    def scale(self) -> float:
        pred = predict(self.cost, self.workers, cores=self.cores, efficiency=self.efficiency)
        return self.loader_rate / pred if pred > 0 else 1.0

    def loader_after(self, new: Cost, workers: int) -> float:
        return self.scale * predict(new, workers, cores=self.cores, efficiency=self.efficiency)

    def change(
        self,
        action: str,
        detail: str,
        new: Cost,
        *,
        basis: str = "measured",
        h2d: float | None = None,
        workers: int | None = None,
        trade: str = "",
        hi: float | None = None,
    ) -> Recommendation:
        """The recommendation for running with ``new`` (and ``h2d``, ``workers`` when given);
        ``trade``: why it changes what the model sees; ``hi``: the high end of the interval
        of the figure ``new`` puts in, as a factor."""
        after = self.loader_after(new, self.workers if workers is None else workers)
        h2d = self.h2d_rate if h2d is None else h2d
        lo = None
        if hi is not None:  # the replaced terms at their low end, the new one at its high end
            low = _ends(self.cost, new, lambda part: self.spreads.get(part, (1.0, 1.0))[0])
            lo = self.loader_after(_ends(new, self.cost, lambda _: hi), self.workers)
            lo /= self.loader_after(low, self.workers)
        return Recommendation(
            action,
            f"{detail}; {trade}" if trade else detail,
            self.loader_rate,
            after,
            self.before,
            delivered(after, h2d, self.model_rate),
            basis,
            bool(trade),
            lo,
        )


def _ends(cost: Cost, other: Cost, factor: Callable[[str], float]) -> Cost:
    """``cost`` with each term that differs in ``other`` times ``factor`` of its part."""
    for term, part in (("read", "storage"), ("decode", "decode"), ("augment", "augment")):
        wall, cpu = getattr(cost, f"{term}_s"), getattr(cost, f"{term}_cpu_s")
        if wall != getattr(other, f"{term}_s"):
            f = factor(part)
            cost = replace(cost, **{f"{term}_s": wall * f, f"{term}_cpu_s": cpu * f})
    return cost


def recommend(
    cost: Cost,
    *,
    workers: int,
    cores: int,
    efficiency: float,
    loader_rate: float,
    h2d_rate: float | None,
    model_rate: float | None,
    packed_read: tuple[float, float, float] | None = None,
    decode_scaled: tuple[float, float, str, float] | None = None,
    resized: tuple[float, float, float, float, str, float] | None = None,
    normalize: tuple[float, float, float | None] | None = None,
    costly_op: tuple[str, float, float, float] | None = None,
    more_workers: int | None = None,
    spreads: dict[str, tuple[float, float]] | None = None,
    trade: str = "",
) -> list[Recommendation]:
    """Each candidate change as a new :class:`Cost`, predicted and compared.

    Inputs (per-sample seconds, wall then CPU, all measured; the last number the wall time at
    the figure's interval's high end): ``packed_read`` read from one packed file;
    ``decode_scaled`` decode at reduced size (+ its label); ``resized`` decode and augment of
    payloads resized at pack time (+ label); ``normalize`` the wall/CPU time of a final
    ``Normalize`` and the host-to-device rate with uint8 batches; ``costly_op`` the most
    expensive augmentation op (name, wall, CPU, share). ``spreads``: the baseline's intervals
    as factors; ``trade``: why the reduced size changes what the model sees ("": it does not).
    """
    base = _Baseline(
        cost, workers, cores, efficiency, loader_rate, h2d_rate, model_rate, spreads or {}
    )
    out = [
        _pack(base, packed_read) if packed_read is not None else None,
        _decode_scaled(base, decode_scaled, trade) if decode_scaled is not None else None,
        _resize(base, resized, trade) if resized is not None else None,
        _normalize(base, normalize) if normalize is not None else None,
        _costly_op(base, costly_op) if costly_op is not None else None,
        _more_workers(base, more_workers) if more_workers is not None else None,
    ]
    return rank([r for r in out if r is not None])


def _pack(base: _Baseline, packed_read: tuple[float, float, float]) -> Recommendation:
    cost = base.cost
    return base.change(
        "pack the folder into RecordIO shards (stoker pack)",
        f"read {1e3 * cost.read_s:.3f} -> {1e3 * packed_read[0]:.3f} ms/sample (one file instead of one per sample)",
        replace(cost, read_s=packed_read[0], read_cpu_s=packed_read[1]),
        hi=packed_read[2] / packed_read[0],
    )


def _decode_scaled(
    base: _Baseline, scaled: tuple[float, float, str, float], trade: str
) -> Recommendation | None:
    cost = base.cost
    if scaled[0] >= _WORTH * cost.decode_s:
        return None
    region = scaled[2].endswith("box only")  # the same pixels: no trade
    return base.change(
        "decode only the crop's box (DecodeOptions(region=True))"
        if region
        else "decode at reduced size (JPEG DCT scaling, scale-on-decode)",
        f"decode {1e3 * cost.decode_s:.3f} -> {1e3 * scaled[0]:.3f} ms/sample ({scaled[2]})",
        replace(cost, decode_s=scaled[0], decode_cpu_s=scaled[1]),
        trade="" if region else trade,
        hi=scaled[3] / scaled[0],
    )


def _resize(
    base: _Baseline, resized: tuple[float, float, float, float, str, float], trade: str
) -> Recommendation | None:
    cost = base.cost
    if resized[0] + resized[2] >= _WORTH * (cost.decode_s + cost.augment_s):
        return None
    new = replace(
        cost,
        decode_s=resized[0],
        decode_cpu_s=resized[1],
        augment_s=resized[2],
        augment_cpu_s=resized[3],
    )
    return base.change(
        "resize at pack time (stoker pack --resize)",
        f"decode+augment {1e3 * (cost.decode_s + cost.augment_s):.3f} -> "
        f"{1e3 * (resized[0] + resized[2]):.3f} ms/sample ({resized[4]})",
        new,
        trade=trade,
        hi=resized[5] / (resized[0] + resized[2]),
    )


def _without_augment(cost: Cost, wall: float, cpu: float) -> Cost:
    """``cost`` with ``wall``/``cpu`` seconds per sample taken out of the augmentation."""
    return replace(
        cost,
        augment_s=max(0.0, cost.augment_s - wall),
        augment_cpu_s=max(0.0, cost.augment_cpu_s - cpu),
    )


def _normalize(base: _Baseline, normalize: tuple[float, float, float | None]) -> Recommendation:
    h2d_rate = base.h2d_rate
    h2d_after = normalize[2] if normalize[2] is not None else h2d_rate
    return base.change(
        "keep batches uint8 and normalise on the GPU (drop the final Normalize)",
        f"Normalize costs {1e3 * normalize[0]:.3f} ms/sample on the CPU; uint8 batches are 4x smaller"
        + (
            f" (copy {h2d_rate:,.0f} -> {h2d_after:,.0f} samples/s)"
            if h2d_rate and h2d_after
            else ""
        ),
        _without_augment(base.cost, normalize[0], normalize[1]),
        h2d=h2d_after,
        basis="measured" if normalize[2] is not None or h2d_rate is None else "estimated",
    )


def _costly_op(base: _Baseline, costly_op: tuple[str, float, float, float]) -> Recommendation:
    name, w, c, share = costly_op
    new = _without_augment(base.cost, w, c)
    if share >= 0.999:  # one opaque transform: an estimate for halving its cost
        return base.change(
            f"cheapen the augmentation ({name})",
            f"it takes {1e3 * base.cost.augment_s:.3f} ms/sample; the figure is for halving that",
            new,
            basis="estimated",
            trade="a cheaper op may change what the model sees",
        )
    return base.change(
        f"drop or cheapen the costliest augmentation: {name}",
        f"it takes {1e3 * w:.3f} ms/sample, {100 * share:.0f} % of the augmentation time",
        new,
        trade="dropping it changes what the model sees",
    )


def _more_workers(base: _Baseline, k: int) -> Recommendation | None:
    cost, workers, loader_rate = base.cost, base.workers, base.loader_rate
    if k <= workers:
        return None
    after = base.loader_after(cost, k)
    if after <= _MORE_WORKERS_GAIN * loader_rate:
        return None
    return base.change(
        f"use more workers (workers={k})",
        f"predicted {after:,.0f} samples/s with {k} vs {loader_rate:,.0f} with {workers}"
        + (
            " (the workers spend most of their time blocked on I/O or asleep, "
            "so more of them overlap it)"
            if cost.blocked_s > cost.cpu_s
            else ""
        ),
        cost,
        basis="estimated",
        workers=k,
    )
