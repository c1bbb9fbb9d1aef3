"""Aspect-ratio buckets: batches of images of similar height and width, for variable-size
training (detection, segmentation) without resizing every image to one shape.

Each image falls in one bucket: first by its aspect ratio ``w / h`` (``ratio_bounds``, or
``num_buckets`` bounds at the ratio's quantiles), then, within that, by its area
(``size_buckets`` quantile groups over the whole set). Buckets are ordered by ratio, then
area, and batched exactly as :class:`~stoker.sampling.LengthBuckets` batches its length
buckets (the same code): each bucket shuffled from (seed, epoch) and cut into full batches, the
tails merged across neighbouring buckets (``small_bucket="merge"``) or left out (``"drop"``),
the batch order shuffled, whole batches split across ranks.

The sampler says ``variable_size = True``: the loader reads every image's stored size from the
source (``Source.image_sizes()``, the same array this sampler is usually built from), gives each
batch the largest height and width its transforms make of its samples, pads the smaller ones
with zeros at the bottom and right (so boxes and points need no change), and carries each
sample's stored size as the ``size`` field. The ring is sized for the largest batch of the
epoch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stoker.sampling._checks import array_digest, check_int
from stoker.sampling.base import Sampler
from stoker.sampling.buckets import LengthBuckets

__all__ = ["AspectBuckets"]


def _as_sizes(sizes: object) -> np.ndarray:
    arr = np.asarray(sizes)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(
            f"sizes must be (N, 2): each image's (height, width), such as "
            f"source.image_sizes(); got shape {arr.shape}"
        )
    if arr.dtype.kind not in "iu":
        raise TypeError(f"sizes must be integers (pixels), got dtype {arr.dtype}")
    if arr.size and arr.min() < 1:
        i = int(np.flatnonzero((arr < 1).any(axis=1))[0])
        raise ValueError(f"sizes[{i}] = {arr[i].tolist()}: an image is at least 1x1")
    return arr.astype(np.int64)


def _ratio_ids(
    ratio: np.ndarray, ratio_bounds: Sequence[float] | None, num_buckets: int | None
) -> tuple[np.ndarray, list[float]]:
    if (ratio_bounds is None) == (num_buckets is None):
        raise ValueError("give exactly one of ratio_bounds= or num_buckets=")
    if ratio_bounds is None:
        k = check_int("num_buckets", num_buckets, minimum=1)
        if not ratio.size:
            return np.zeros(0, np.int64), [1.0]
        qs = np.quantile(ratio, np.linspace(0, 1, k + 1)[1:], method="higher")
        bounds = np.unique(qs)
    else:
        bounds = np.asarray([float(b) for b in ratio_bounds], dtype=np.float64)
        if bounds.size == 0 or not np.all(np.isfinite(bounds)) or bounds.min() <= 0:
            raise ValueError(f"ratio_bounds must be numbers > 0, got {list(ratio_bounds)}")
        if np.any(np.diff(bounds) <= 0):
            raise ValueError(f"ratio_bounds must be strictly increasing, got {bounds.tolist()}")
    ids = np.searchsorted(bounds, ratio, side="left")
    over = ids >= len(bounds)
    if over.any():
        i = int(np.flatnonzero(over)[0])
        raise ValueError(
            f"{int(over.sum())} image(s) are wider than the last ratio bound {bounds[-1]:g} "
            f"(first: sizes[{i}], w/h = {ratio[i]:g}); add a larger bound"
        )
    return ids.astype(np.int64), bounds.tolist()


class AspectBuckets(Sampler):
    """Batches of images of similar height and width (see the module docstring).

    ``sizes``: int ``(N, 2)`` (height, width) per sample, in dataset order
    (``source.image_sizes()``). ``ratio_bounds``: increasing inclusive upper bounds of
    ``w / h`` (``[0.9, 1.1, 10]``: portrait, square, landscape); or ``num_buckets`` at
    quantiles. ``size_buckets``: area groups within each ratio bucket (1: none). The other
    arguments are :class:`~stoker.sampling.LengthBuckets`'s.
    """

    variable_size = True

    def __init__(
        self,
        sizes: object,
        *,
        batch_size: int,
        ratio_bounds: Sequence[float] | None = None,
        num_buckets: int | None = None,
        size_buckets: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        small_bucket: str = "merge",
    ) -> None:
        hw = _as_sizes(sizes)
        self.sizes = hw
        ratio = hw[:, 1] / np.maximum(hw[:, 0], 1)
        ratio_ids, bounds = _ratio_ids(ratio, ratio_bounds, num_buckets)
        self.ratio_bounds = bounds
        k = check_int("size_buckets", size_buckets, minimum=1)
        area = hw[:, 0] * hw[:, 1]
        if k > 1 and area.size:
            cuts = np.unique(np.quantile(area, np.linspace(0, 1, k + 1)[1:-1], method="higher"))
            size_ids = np.searchsorted(cuts, area, side="left")
        else:
            size_ids = np.zeros(len(area), np.int64)
        self.bucket_key = ratio_ids * k + size_ids  # ratio first, then area
        nkeys = len(bounds) * k
        self._inner = LengthBuckets(
            self.bucket_key,
            batch_size=batch_size,
            bucket_bounds=list(range(nkeys)),
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
            small_bucket=small_bucket,
        )
        inner = self._inner
        self.batch_size, self.seed, self.rank, self.world_size = (
            inner.batch_size,
            inner.seed,
            inner.rank,
            inner.world_size,
        )
        self.padding, self.dropped = inner.padding, inner.dropped
        self.epoch = 0
        fp = inner.fingerprint()
        fp.update(
            type="AspectBuckets",
            sizes=array_digest(hw),
            ratio_bounds=bounds,
            size_buckets=k,
        )
        del fp["lengths"], fp["bounds"], fp["widths"]
        self._fp = fp

    def __len__(self) -> int:
        return len(self._inner)

    def indices(self, epoch: int) -> np.ndarray:
        return self._inner.indices(epoch)

    def batches(self, epoch: int) -> np.ndarray:
        """This rank's batches for ``epoch`` as a ``(batches, batch_size)`` array of positions."""
        return self._inner.batches(epoch)

    def batch_sizes(self, epoch: int) -> np.ndarray:
        """int64 ``(batches, 2)``: each of this rank's batches' largest stored (height, width)
        (what the loader pads to when the transforms keep the size)."""
        return self.sizes[self.batches(epoch)].max(axis=1)  # (0, batch_size) gives (0, 2)

    def report(self) -> dict:
        """What this configuration does to an epoch (:meth:`LengthBuckets.report`)."""
        rep = self._inner.report()
        rep["ratio_bounds"] = self.ratio_bounds
        del rep["bounds"]
        return rep

    def fingerprint(self) -> dict:
        return dict(self._fp)
