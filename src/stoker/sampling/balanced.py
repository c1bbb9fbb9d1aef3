"""Class-balanced sampling that also works across ranks.

Each epoch one *global* draw of ``num_samples`` positions is made from (seed, epoch), the same
on every rank, and then split across ranks like any other order (:func:`split_for_rank`). So
``world_size`` GPUs together see one weighted sample of the dataset per epoch, which
``torch.utils.data.WeightedRandomSampler`` (one process only) cannot do.

Weights (per sample; a class's share of the draw is its sample count times its weight):

- ``"inverse"`` (default): ``1 / n_c`` — every class present equally often (the
  ``len(labels) / count`` recipe of the WeightedRandomSampler tutorials, up to a constant);
- ``"sqrt_inverse"``: ``1 / sqrt(n_c)`` — a milder balance;
- a mapping ``{class: w}`` or a sequence indexed by an integer class (e.g. the output of
  :func:`stoker.train.class_weights`): weight ``w`` for each sample of that class;
- ``sample_weights=``: one weight per sample.

Weights must be finite and > 0 (``ValueError`` names the class or sample); to leave samples out
use :class:`~stoker.sampling.Subset` or :func:`~stoker.sampling.filter_by_label_frequency`.
Classes that have a weight (or are below ``num_classes``) but no sample are excluded with a
warning.

``replacement=False`` draws without replacement with weights (Efraimidis–Spirakis keys
``log(u) / w``, the largest ``num_samples`` keys in decreasing order), so an epoch has no
duplicate before the rank padding.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import numpy as np

from stoker._core.seeding import stream_rng
from stoker.sampling._checks import (
    array_digest,
    as_labels,
    check_epoch,
    check_int,
    check_rank,
    check_seed,
)
from stoker.sampling.order import SplitSampler, split_for_rank

__all__ = ["ClassBalanced"]

_DOMAIN_BALANCED = 2
_SCHEMES = ("inverse", "sqrt_inverse")


def _check_weight(w: object, what: str) -> float:
    try:
        f = float(w)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"weight of {what} must be a number, got {w!r}") from None
    if not math.isfinite(f) or f <= 0:
        raise ValueError(
            f"weight of {what} must be finite and > 0, got {w!r}; to leave samples out, "
            "filter them (stoker.sampling.Subset or filter_by_label_frequency)"
        )
    return f


class ClassBalanced(SplitSampler):
    """A weighted draw of ``num_samples`` positions per epoch, split across ranks.

    ``labels``: one class per sample (ints, whole floats or strings). ``num_samples`` is the
    global draw per epoch (default: ``len(labels)``); each rank gets ``len(self)`` of it.
    ``.classes`` and ``.target`` give the class distribution the draw converges to.
    """

    def __init__(
        self,
        labels: object,
        *,
        weights: str | Mapping | object = "inverse",
        sample_weights: object = None,
        num_classes: int | None = None,
        num_samples: int | None = None,
        replacement: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        lab = as_labels(labels)
        n = len(lab)
        self.rank, self.world_size = check_rank(rank, world_size)
        self.seed = check_seed(seed)
        self.replacement = bool(replacement)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        if num_classes is not None:
            num_classes = _check_num_classes(lab, num_classes)
        classes, inverse, counts = np.unique(lab, return_inverse=True, return_counts=True)
        inverse = inverse.reshape(-1)
        declared: set = set(range(num_classes)) if num_classes is not None else set()
        per_sample, weights_desc, unused = _sample_weights(
            lab, classes, inverse, counts, weights=weights, sample_weights=sample_weights
        )
        declared |= unused

        empty = sorted(declared - set(classes.tolist()), key=str)
        if empty:
            shown = ", ".join(repr(c) for c in empty[:10]) + (" ..." if len(empty) > 10 else "")
            warnings.warn(
                f"ClassBalanced: {len(empty)} class(es) have no samples and are excluded: {shown}",
                UserWarning,
                stacklevel=2,
            )
        self.empty_classes = empty

        if num_samples is None:
            num_samples = n
        self.num_samples = check_int("num_samples", num_samples, minimum=0)
        if self.num_samples and n == 0:
            raise ValueError("labels is empty: nothing to draw from")
        if not self.replacement and self.num_samples > n:
            raise ValueError(
                f"num_samples={self.num_samples} > {n} samples: without replacement an epoch "
                "cannot draw more samples than there are; use replacement=True"
            )
        self.n = n
        self._weights = per_sample.astype(np.float64)
        self._cum = np.cumsum(self._weights)
        self.classes = classes
        mass = (
            np.bincount(inverse, weights=self._weights, minlength=len(classes))
            if n
            else np.zeros(0)
        )
        self.target = mass / mass.sum() if n else mass
        self._fp = {
            "type": "ClassBalanced",
            "n": n,
            "labels": array_digest(lab),
            "weights": weights_desc,
            "num_samples": self.num_samples,
            "replacement": self.replacement,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
        }

    def global_size(self) -> int:
        return self.num_samples

    def global_draw(self, epoch: int) -> np.ndarray:
        """The draw of all ranks for ``epoch`` (``num_samples`` positions), before the split."""
        epoch = check_epoch(epoch)
        k = self.num_samples
        if k == 0:
            return np.zeros(0, dtype=np.int64)
        rng = stream_rng(self.seed, _DOMAIN_BALANCED, epoch)
        if self.replacement:
            u = rng.random(k) * self._cum[-1]
            pos = np.searchsorted(self._cum, u, side="right")
            return np.minimum(pos, self.n - 1).astype(np.int64)
        keys = np.log1p(-rng.random(self.n)) / self._weights  # log(u) / w, u in (0, 1]
        top = np.argpartition(-keys, k - 1)[:k] if k < self.n else np.arange(self.n)
        return top[np.argsort(-keys[top], kind="stable")].astype(np.int64)

    def indices(self, epoch: int) -> np.ndarray:
        draw = self.global_draw(epoch)
        return split_for_rank(draw, self.rank, self.world_size, drop_last=self.drop_last)

    def fingerprint(self) -> dict:
        return dict(self._fp)


def _check_num_classes(lab: np.ndarray, num_classes: object) -> int:
    """``num_classes`` checked against integer labels, naming the first label outside it."""
    k = check_int("num_classes", num_classes, minimum=1)
    if lab.dtype.kind != "i":
        raise TypeError("num_classes needs integer labels")
    if len(lab) and (lab.min() < 0 or lab.max() >= k):
        i = int(np.flatnonzero((lab < 0) | (lab >= k))[0])
        raise ValueError(f"labels[{i}] = {lab[i]} is outside [0, num_classes={k})")
    return k


def _sample_weights(
    lab: np.ndarray,
    classes: np.ndarray,
    inverse: np.ndarray,
    counts: np.ndarray,
    *,
    weights: object,
    sample_weights: object,
) -> tuple[np.ndarray, object, set]:
    """Each sample's draw weight, the weights' description for the fingerprint, and the
    classes that were given a weight but have no sample."""
    n = len(lab)
    if sample_weights is not None:
        if not (isinstance(weights, str) and weights == "inverse"):
            raise ValueError("give either weights= or sample_weights=, not both")
        sw = np.asarray(sample_weights, dtype=np.float64)
        if sw.shape != (n,):
            raise ValueError(
                f"sample_weights must have one weight per sample: shape ({n},), got {sw.shape}"
            )
        bad = ~np.isfinite(sw) | (sw <= 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            _check_weight(sw[i], f"sample {i}")
        return sw, {"sample_weights": array_digest(sw)}, set()
    if isinstance(weights, str):
        if weights not in _SCHEMES:
            raise ValueError(
                f"weights must be one of {_SCHEMES}, a mapping or a sequence, got {weights!r}"
            )
        per_class = 1.0 / counts if weights == "inverse" else 1.0 / np.sqrt(counts)
        return (per_class[inverse] if n else np.zeros(0)), weights, set()
    table = _weight_table(lab, weights)
    present = set(classes.tolist())
    per_class = np.empty(len(classes), dtype=np.float64)
    for j, c in enumerate(classes.tolist()):
        if c not in table:
            raise ValueError(f"class {c!r} has {counts[j]} samples but no weight")
        per_class[j] = _check_weight(table[c], f"class {c!r}")
    for c, w in table.items():
        if c not in present:
            _check_weight(w, f"class {c!r}")
    desc = {str(k): float(v) for k, v in sorted(table.items(), key=lambda kv: str(kv[0]))}
    return (per_class[inverse] if n else np.zeros(0)), desc, set(table) - present


def _weight_table(lab: np.ndarray, weights: object) -> dict:
    """Per-class weights given as a mapping or as a sequence indexed by class number."""
    if isinstance(weights, Mapping):
        return dict(weights)
    seq = np.asarray(weights)
    if seq.ndim != 1:
        raise ValueError(f"per-class weights must be 1-D, got shape {seq.shape}")
    if lab.dtype.kind != "i":
        raise TypeError("a weight sequence is indexed by class number: labels must be integers")
    return {i: seq[i] for i in range(len(seq))}
