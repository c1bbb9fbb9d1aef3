"""Length buckets: batches of samples with similar label length, each batch with its own width.

For CTC/attention OCR (seed 001): sort text-line samples into buckets by label length (say
``<= 5``, ``<= 10``, ``<= 15`` characters); each batch comes from one bucket and is resized to
that bucket's width (e.g. 100x32 for short labels, 200x32 for longer ones), since a fully
convolutional model does not care that batches differ from each other.

Per epoch, from (seed, epoch):

1. each bucket's samples are shuffled (``shuffle=True``) and cut into full batches;
2. the tail of each bucket that does not fill a batch (a bucket smaller than a batch is all
   tail) follows ``small_bucket``:

   - ``"merge"`` (default): the tails of all buckets, in length order, are cut into batches
     that span neighbouring buckets; such a batch gets the width of its longest sample. The
     last incomplete batch is filled up with repeats of its own samples (``drop_last=False``,
     counted in ``.padding``) or dropped (``drop_last=True``, counted in ``.dropped``). Every
     sample is in the epoch exactly once, apart from that fill and the rank padding.
   - ``"drop"``: the tails are left out of this epoch (counted in ``.dropped``; which samples
     they are changes with the epoch when shuffling);

3. the batch order is shuffled (or, without ``shuffle``, ascending by length);
4. whole batches are split across ranks (rank ``r`` takes batches ``r::world_size``); without
   ``drop_last`` the batch list is padded by wrapping to a multiple of ``world_size`` (at most
   ``world_size - 1`` batches repeated), with it at most ``world_size - 1`` batches are dropped.

``indices(epoch)`` is this rank's batches back to back: each consecutive ``batch_size`` chunk
is one batch. ``batch_widths(epoch, batch_size)`` gives one width per chunk. The counts in
:meth:`report` are the same every epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from stoker._core.seeding import stream_rng
from stoker.sampling._checks import array_digest, check_epoch, check_int, check_rank, check_seed
from stoker.sampling.base import Sampler
from stoker.sampling.order import split_for_rank

__all__ = ["LengthBuckets", "ProportionalWidth"]

_DOMAIN_BUCKETS = 3
_POLICIES = ("merge", "drop")


@dataclass(frozen=True)
class ProportionalWidth:
    """Width from the longest label of a batch: ``multiple * ceil(length * per_char / multiple)``,
    clipped to ``[min_width, max_width]``.

    ``ProportionalWidth(20, multiple=4)`` turns a batch whose longest label has 5 characters
    into width 100 and one with 10 characters into 200 (seed 001's 100x32 and 200x32).
    """

    per_char: float
    multiple: int = 8
    min_width: int | None = None
    max_width: int | None = None

    def __post_init__(self) -> None:
        if (
            not (isinstance(self.per_char, (int, float)) and math.isfinite(self.per_char))
            or self.per_char <= 0
        ):
            raise ValueError(f"per_char must be a number > 0, got {self.per_char!r}")
        check_int("multiple", self.multiple, minimum=1)
        if self.min_width is not None:
            check_int("min_width", self.min_width, minimum=1)
        if self.max_width is not None:
            check_int("max_width", self.max_width, minimum=1)
            if self.max_width < (self.min_width or self.multiple):
                raise ValueError(f"max_width={self.max_width} is below min_width")

    def __call__(self, length: int) -> int:
        w = self.multiple * math.ceil(length * self.per_char / self.multiple)
        w = max(w, self.min_width if self.min_width is not None else self.multiple)
        if self.max_width is not None:
            w = min(w, self.max_width)
        return int(w)


def _as_lengths(lengths: object) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(
            f"lengths must be 1-D (one label length per sample), got shape {arr.shape}"
        )
    if arr.dtype.kind == "O":
        for i, x in enumerate(arr.tolist()):
            if x is None:
                raise ValueError(f"lengths[{i}] is missing (None)")
        try:
            arr = arr.astype(np.float64)
        except (TypeError, ValueError):
            raise TypeError("lengths must be numbers (label lengths in characters)") from None
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            what = "missing (NaN)" if np.isnan(arr[i]) else f"{arr[i].item()!r}, not a whole number"
            raise ValueError(f"lengths[{i}] is {what}")
    elif arr.dtype.kind not in "iub":
        raise TypeError(f"lengths must be integers, got dtype {arr.dtype}")
    out = arr.astype(np.int64)
    if out.size and out.min() < 0:
        i = int(np.flatnonzero(out < 0)[0])
        raise ValueError(f"lengths[{i}] = {out[i]} is negative")
    return out


def _describe_callable(fn: Callable[[int], int]) -> str:
    """A stable text for a fingerprint: a dataclass's repr, else the function's dotted name."""
    if hasattr(fn, "__dataclass_fields__"):
        return repr(fn)
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    return f"{getattr(fn, '__module__', '?')}.{name}"


def _quantile_bounds(lengths: np.ndarray, num_buckets: int) -> np.ndarray:
    if lengths.size == 0:
        return np.zeros(1, dtype=np.int64)
    qs = np.quantile(lengths, np.linspace(0, 1, num_buckets + 1)[1:], method="higher")
    return np.unique(qs.astype(np.int64))


class LengthBuckets(Sampler):
    """Batches of similar label length (see the module docstring for the exact rules).

    ``bucket_bounds``: increasing inclusive upper bounds (``[5, 10, 15]`` makes buckets
    ``<= 5``, ``6..10``, ``11..15``); a length above the last bound is a ``ValueError``.
    ``num_buckets``: bounds at length quantiles instead. ``widths``: ``None`` (no per-batch
    width), one width per bucket, or a callable ``f(max_length_in_batch) -> width`` such as
    :class:`ProportionalWidth`. ``dataset_size``: when given, ``len(lengths)`` must match it.
    """

    variable_width = True

    def __init__(
        self,
        lengths: object,
        *,
        batch_size: int,
        bucket_bounds: Sequence[int] | None = None,
        num_buckets: int | None = None,
        widths: Sequence[int] | Callable[[int], int] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
        small_bucket: str = "merge",
        dataset_size: int | None = None,
    ) -> None:
        lens = _as_lengths(lengths)
        n = len(lens)
        if dataset_size is not None:
            dataset_size = check_int("dataset_size", dataset_size, minimum=0)
            if dataset_size != n:
                raise ValueError(
                    f"lengths has {n} entries but the dataset has {dataset_size} samples: "
                    "give one label length per sample, in dataset order"
                )
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.rank, self.world_size = check_rank(rank, world_size)
        self.seed = check_seed(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        if small_bucket not in _POLICIES:
            raise ValueError(f"small_bucket must be one of {_POLICIES}, got {small_bucket!r}")
        self.small_bucket = small_bucket
        self.epoch = 0

        bounds = _bounds(lens, bucket_bounds, num_buckets)
        bucket = np.searchsorted(bounds, lens, side="left")
        over = bucket >= len(bounds)
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise ValueError(
                f"{int(over.sum())} sample(s) are longer than the last bucket bound "
                f"{int(bounds[-1])} (first: lengths[{i}] = {lens[i]}, longest {int(lens.max())}); "
                "add a larger bound or filter those samples out"
            )
        self.lengths = lens
        self.bounds = bounds
        self.bucket_ids = bucket.astype(np.int64)
        nb = len(bounds)
        self.bucket_sizes = np.bincount(self.bucket_ids, minlength=nb).astype(np.int64)

        self._width_fn: Callable[[int], int] | None = None
        self._bucket_widths: np.ndarray | None = None
        if widths is None:
            widths_desc: object = None
        elif callable(widths):
            self._width_fn = widths
            widths_desc = _describe_callable(widths)
        else:
            w = [check_int("widths entry", x, minimum=1) for x in widths]
            if len(w) != nb:
                raise ValueError(
                    f"widths has {len(w)} entries for {nb} buckets (bounds {bounds.tolist()})"
                )
            self._bucket_widths = np.asarray(w, dtype=np.int64)
            widths_desc = w

        self._count_batches()
        self._memo: tuple[int, np.ndarray, np.ndarray] | None = None
        self._fp = {
            "type": "LengthBuckets",
            "n": n,
            "lengths": array_digest(lens),
            "bounds": bounds.tolist(),
            "batch_size": self.batch_size,
            "widths": widths_desc,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            "small_bucket": small_bucket,
        }

    def _count_batches(self) -> None:
        """Batches per epoch, globally and per rank, and what the split pads or drops."""
        bs, small_bucket = self.batch_size, self.small_bucket
        full = int(np.sum(self.bucket_sizes // bs))
        tail = int(np.sum(self.bucket_sizes % bs))
        if small_bucket == "merge":
            merged_batches = tail // bs if self.drop_last else -(-tail // bs)
            fill = 0 if self.drop_last else (-tail) % bs
            dropped_tail = tail % bs if self.drop_last else 0
        else:
            merged_batches, fill, dropped_tail = 0, 0, tail
        self.num_batches = full + merged_batches  # global, before the rank split
        nbat, w_ = self.num_batches, self.world_size
        if self.drop_last:
            rank_pad, rank_drop, per_rank = 0, nbat % w_, nbat // w_
        else:
            rank_pad, rank_drop, per_rank = (-nbat) % w_ if nbat else 0, 0, -(-nbat // w_)
        self._per_rank_batches = per_rank
        self.tail = tail
        self.merged = tail - dropped_tail if small_bucket == "merge" else 0
        self.padding = fill + rank_pad * bs
        self.dropped = dropped_tail + rank_drop * bs

    def __len__(self) -> int:
        return self._per_rank_batches * self.batch_size

    def report(self) -> dict:
        """What this configuration does to an epoch (the same numbers every epoch)."""
        return {
            "samples": len(self.lengths),
            "bounds": self.bounds.tolist(),
            "bucket_sizes": self.bucket_sizes.tolist(),
            "batch_size": self.batch_size,
            "batches": self.num_batches,
            "batches_per_rank": self._per_rank_batches,
            "small_bucket": self.small_bucket,
            "tail": self.tail,
            "merged": self.merged,
            "padding": self.padding,
            "dropped": self.dropped,
        }

    def _width(self, members: np.ndarray) -> int:
        if self._width_fn is not None:
            w = self._width_fn(int(self.lengths[members].max()))
            return check_int("width returned by widths()", w, minimum=1)
        widths = cast(np.ndarray, self._bucket_widths)
        return int(widths[self.bucket_ids[members].max()])

    def global_batches(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """All batches of ``epoch`` before the rank split: ``(batches (B, batch_size), key)``
        where ``key`` is each batch's highest bucket (the bucket whose width it gets)."""
        epoch = check_epoch(epoch)
        bs = self.batch_size
        rng = stream_rng(self.seed, _DOMAIN_BUCKETS, epoch)
        batches: list[np.ndarray] = []
        keys: list[int] = []
        tails: list[np.ndarray] = []
        order = np.argsort(self.bucket_ids, kind="stable")
        starts = np.concatenate([[0], np.cumsum(self.bucket_sizes)])
        for b in range(len(self.bounds)):
            members = order[starts[b] : starts[b + 1]]
            if self.shuffle:
                members = members[rng.permutation(len(members))]
            k = len(members) // bs
            if k:
                batches.extend(members[: k * bs].reshape(k, bs))
                keys.extend([b] * k)
            tails.append(members[k * bs :])
        if self.small_bucket == "merge":
            pool = np.concatenate(tails).astype(np.int64) if tails else np.zeros(0, np.int64)
            k = len(pool) // bs
            for j in range(k):
                chunk = pool[j * bs : (j + 1) * bs]
                batches.append(chunk)
                keys.append(int(self.bucket_ids[chunk].max()))
            rest = pool[k * bs :]
            if len(rest) and not self.drop_last:
                chunk = np.resize(rest, bs)
                batches.append(chunk)
                keys.append(int(self.bucket_ids[chunk].max()))
        if not batches:
            return np.zeros((0, bs), dtype=np.int64), np.zeros(0, dtype=np.int64)
        arr = np.stack(batches).astype(np.int64)
        key = np.asarray(keys, dtype=np.int64)
        if self.shuffle:
            perm = rng.permutation(len(arr))
        else:
            perm = np.argsort(key, kind="stable")
        return arr[perm], key[perm]

    def batches(self, epoch: int) -> np.ndarray:
        """This rank's batches for ``epoch`` as a ``(batches, batch_size)`` array of positions."""
        return self._plan(epoch)[0]

    def _plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        epoch = check_epoch(epoch)
        memo = self._memo
        if memo is not None and memo[0] == epoch:
            return memo[1], memo[2]
        glob, _ = self.global_batches(epoch)
        ids = split_for_rank(
            np.arange(len(glob)), self.rank, self.world_size, drop_last=self.drop_last
        )
        mine = glob[ids] if len(ids) else np.zeros((0, self.batch_size), dtype=np.int64)
        if self._width_fn is None and self._bucket_widths is None:
            widths = np.zeros(0, dtype=np.int64)
        else:
            widths = np.asarray([self._width(b) for b in mine], dtype=np.int64)
        self._memo = (epoch, mine, widths)
        return mine, widths

    def indices(self, epoch: int) -> np.ndarray:
        return self._plan(epoch)[0].reshape(-1)

    def batch_widths(self, epoch: int, batch_size: int) -> np.ndarray | None:
        if check_int("batch_size", batch_size, minimum=1) != self.batch_size:
            raise ValueError(
                f"LengthBuckets was built with batch_size={self.batch_size} but batches of "
                f"{batch_size} samples were asked for; use the loader's batch size (with "
                "pair_with, half of it: each sample fills two rows)"
            )
        if self._width_fn is None and self._bucket_widths is None:
            return None
        return self._plan(epoch)[1].copy()

    def fingerprint(self) -> dict:
        return dict(self._fp)


def _bounds(
    lens: np.ndarray, bucket_bounds: Sequence[int] | None, num_buckets: int | None
) -> np.ndarray:
    """The buckets' inclusive upper bounds: given, or at length quantiles."""
    if (bucket_bounds is None) == (num_buckets is None):
        raise ValueError("give exactly one of bucket_bounds= or num_buckets=")
    if bucket_bounds is None:
        return _quantile_bounds(lens, check_int("num_buckets", num_buckets, minimum=1))
    bounds = np.asarray(
        [check_int("bucket_bounds entry", b, minimum=0) for b in bucket_bounds], dtype=np.int64
    )
    if bounds.size == 0:
        raise ValueError("bucket_bounds is empty")
    if np.any(np.diff(bounds) <= 0):
        raise ValueError(f"bucket_bounds must be strictly increasing, got {bounds.tolist()}")
    return bounds
