"""Batch mixing: ``MixUp``, ``CutMix`` and timm's random choice of the two (``MixUpCutMix``),
labels turned into soft targets of ``num_classes``. ``Loader(mix=...)`` runs it in the worker
that fills a chunk, on pairs of neighbouring rows ``(2k, 2k + 1)`` (chunks have an even number of
rows), with one draw per batch (timm's ``mode="batch"``) from a generator keyed by ``(seed,
epoch, batch number)``: every worker of a batch draws the same, a resume draws it again.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass
from typing import ClassVar

import numpy as np

from stoker._core.seeding import stream_rng

__all__ = ["BatchMix", "CutMix", "MixUp", "MixUpCutMix", "batch_rng"]

_DOMAIN_MIX = 0x4D49_5855  # a batch's mixing stream


def batch_rng(seed: int, epoch: int, number: int) -> np.random.Generator:
    """The generator that batch ``number`` of ``epoch`` mixes with."""
    return stream_rng(seed, _DOMAIN_MIX, epoch, number)


@dataclass(frozen=True)
class BatchMix:
    """Mix pairs of rows with probability ``p`` per batch: MixUp with ``lam ~ Beta(a, a)``
    for ``a = mixup_alpha``, or CutMix with ``a = cutmix_alpha``, CutMix chosen with
    ``switch_prob`` when both alphas are above 0 (timm's ``Mixup``). Targets are ``lam · y_a
    + (1 - lam) · y_b`` of one-hot vectors smoothed by ``label_smoothing`` (``1 - s + s/C``
    on, ``s/C`` off). CutMix swaps a box of ``sqrt(1 - lam)`` of each side centred at a
    uniform pixel, clipped to the image, and sets ``lam`` to the share of the image it leaves
    (timm's ``correct_lam``)."""

    _: KW_ONLY
    num_classes: int
    label_smoothing: float = 0.0
    p: float = 1.0
    mixup_alpha: ClassVar[float] = 0.0
    cutmix_alpha: ClassVar[float] = 0.0
    switch_prob: ClassVar[float] = 0.5

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not (isinstance(self.num_classes, int) and self.num_classes >= 2):
            raise ValueError(f"{name}: num_classes must be an int >= 2, got {self.num_classes!r}")
        if (
            min(self.mixup_alpha, self.cutmix_alpha) < 0
            or self.mixup_alpha == self.cutmix_alpha == 0
        ):
            raise ValueError(f"{name}: alpha must be > 0")
        for what in ("switch_prob", "label_smoothing", "p"):
            if not 0.0 <= getattr(self, what) <= 1.0:
                raise ValueError(f"{name}: {what} must lie in [0, 1], got {getattr(self, what)!r}")

    def params(
        self, hw: tuple[int, int], rng: np.random.Generator
    ) -> tuple[str | None, float, tuple[int, int, int, int]]:
        """``(kind, lam, (top, bottom, left, right))`` for a batch of ``hw`` images: ``kind``
        ``"mixup"``, ``"cutmix"`` or ``None`` (not mixed)."""
        u = rng.random(2)
        none = (None, 1.0, (0, 0, 0, 0))
        if u[0] >= self.p:
            return none
        cut = self.cutmix_alpha > 0 and (self.mixup_alpha == 0 or u[1] < self.switch_prob)
        alpha = self.cutmix_alpha if cut else self.mixup_alpha
        lam = float(rng.beta(alpha, alpha))
        if not cut:
            return ("mixup", lam, (0, 0, 0, 0))
        h, w = hw
        ch, cw = int(h * math.sqrt(1.0 - lam)), int(w * math.sqrt(1.0 - lam))
        cy, cx = (int(v) for v in rng.integers(0, (h, w)))
        t, b = max(cy - ch // 2, 0), min(cy + ch // 2, h)
        left, r = max(cx - cw // 2, 0), min(cx + cw // 2, w)
        return ("cutmix", 1.0 - (b - t) * (r - left) / (h * w), (t, b, left, r))

    def targets(self, a: int, b: int, lam: float) -> np.ndarray:
        """The soft target of a row of class ``a`` mixed with one of class ``b``."""
        off = self.label_smoothing / self.num_classes
        out = np.full(self.num_classes, off, np.float32)
        out[a] += lam * (1.0 - self.label_smoothing)
        out[b] += (1.0 - lam) * (1.0 - self.label_smoothing)
        return out

    def mix_rows(
        self,
        images: np.ndarray,
        classes: np.ndarray,
        labels: np.ndarray,
        rows: range,
        rng: np.random.Generator,
        *,
        chw: bool,
        skip: frozenset[int] = frozenset(),
    ) -> None:
        """Mix the pairs ``(r, r + 1)`` of ``rows`` (which starts even) of ``images`` in place
        and write their soft ``labels`` from integer ``classes``; a row without a partner (the
        last of an odd batch, or one whose partner is in ``skip``) keeps its image and gets its
        own class's target."""
        if rows.start % 2:
            raise ValueError(f"mixing starts at row {rows.start}: pairs start on even rows")
        hw = images.shape[2:4] if chw else images.shape[1:3]
        kind, lam, (t, b, left, r) = self.params((int(hw[0]), int(hw[1])), rng)
        for i in rows:
            j = i + 1 if i % 2 == 0 else i - 1
            alone = kind is None or j not in rows or i in skip or j in skip
            labels[i] = self.targets(
                int(classes[i]), int(classes[j if not alone else i]), 1.0 if alone else lam
            )
            if alone or i % 2:
                continue
            x, y = images[i], images[j]
            if kind == "cutmix":
                box = (
                    (slice(None), slice(t, b), slice(left, r))
                    if chw
                    else (slice(t, b), slice(left, r))
                )
                x[box], y[box] = y[box].copy(), x[box].copy()
                continue
            fx, fy = x.reshape(x.shape[0], -1), y.reshape(y.shape[0], -1)
            mixed = _blend(fx, fy, lam)
            fy[...] = _blend(fy, fx, lam)
            fx[...] = mixed


def _blend(a: np.ndarray, b: np.ndarray, lam: float) -> np.ndarray:
    """``lam · a + (1 - lam) · b``, rounded for integer rows."""
    import cv2

    return cv2.addWeighted(a, lam, b, 1.0 - lam, 0.0)


@dataclass(frozen=True)
class MixUp(BatchMix):
    """MixUp: ``MixUp(alpha, num_classes=...)``; no label smoothing unless asked."""

    mixup_alpha: float = 0.8  # type: ignore[misc]


@dataclass(frozen=True)
class CutMix(BatchMix):
    """CutMix: ``CutMix(alpha, num_classes=...)``; no label smoothing unless asked."""

    cutmix_alpha: float = 1.0  # type: ignore[misc]


@dataclass(frozen=True)
class MixUpCutMix(BatchMix):
    """timm's ``Mixup``: MixUp or CutMix per batch (CutMix with ``switch_prob``), with its
    defaults (0.8, 1.0, half and half, label smoothing 0.1)."""

    mixup_alpha: float = 0.8  # type: ignore[misc]
    cutmix_alpha: float = 1.0  # type: ignore[misc]
    _: KW_ONLY
    switch_prob: float = 0.5  # type: ignore[misc]
    label_smoothing: float = 0.1
