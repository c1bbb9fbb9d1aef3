"""Dropping the two tails of a label distribution (seed 001: labels that occur very rarely or
very often make a worse training set), with a report of what went.

``by="label"`` (classification): a label seen fewer than ``min_count`` times loses all its
samples; a label seen more than ``max_count`` times keeps a seeded random ``max_count`` of
them.

``by="char"`` (OCR text labels): counts characters over all texts. A text containing a
character seen fewer than ``min_count`` times is dropped. With ``max_count``, texts are taken
rarest first (a text's rarity is the count of its rarest character; ties in seeded random
order) and a text is kept only while none of its characters would go above ``max_count`` in
the kept texts, so frequent characters are thinned out and texts with rare ones kept.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from stoker._core.seeding import stream_rng
from stoker.sampling._checks import as_labels, check_int, check_seed

__all__ = ["FrequencyReport", "filter_by_label_frequency"]

_DOMAIN_FILTER = 5


@dataclass(frozen=True)
class FrequencyReport:
    """What :func:`filter_by_label_frequency` dropped.

    ``rare``: label (or character) -> samples dropped because it was below ``min_count``;
    ``capped``: label (or character) -> samples dropped because it was above ``max_count``.
    """

    by: str
    total: int
    kept: int
    min_count: int | None
    max_count: int | None
    rare: dict = field(default_factory=dict)
    capped: dict = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return self.total - self.kept

    def to_dict(self) -> dict:
        """JSON-safe form (keys as strings)."""
        d = asdict(self)
        for k in ("rare", "capped"):
            d[k] = {str(c): int(n) for c, n in d[k].items()}
        return {**d, "dropped": self.dropped}

    def __str__(self) -> str:
        return (
            f"kept {self.kept} of {self.total} samples: dropped {sum(self.rare.values())} "
            f"with {len(self.rare)} rare {self.by}(s) (< {self.min_count}) and "
            f"{sum(self.capped.values())} over the cap of {self.max_count}"
        )


def filter_by_label_frequency(
    labels: object,
    *,
    min_count: int | None = None,
    max_count: int | None = None,
    by: str = "label",
    seed: int = 0,
) -> tuple[np.ndarray, FrequencyReport]:
    """``(kept_indices, report)``: sorted int64 positions to keep, and what was dropped.

    Feed ``kept_indices`` to :class:`~stoker.sampling.Subset` (or ``ClassBalanced(labels[kept])``
    mapped back through it) to train on the filtered set without rewriting the data.
    """
    if by not in ("label", "char"):
        raise ValueError(f"by must be 'label' or 'char', got {by!r}")
    if min_count is not None:
        min_count = check_int("min_count", min_count, minimum=1)
    if max_count is not None:
        max_count = check_int("max_count", max_count, minimum=1)
    if min_count is not None and max_count is not None and max_count < min_count:
        raise ValueError(f"max_count={max_count} is below min_count={min_count}")
    seed = check_seed(seed)
    lab = as_labels(labels)
    if by == "char":
        if lab.dtype.kind != "U" and len(lab):
            raise TypeError("by='char' needs text labels (strings)")
        return _filter_chars([str(t) for t in lab.tolist()], min_count, max_count, seed)

    n = len(lab)
    keep = np.ones(n, dtype=bool)
    rare: dict = {}
    capped: dict = {}
    classes, inverse, counts = np.unique(lab, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    rng = stream_rng(seed, _DOMAIN_FILTER)
    for j, c in enumerate(classes.tolist()):
        cnt = int(counts[j])
        if min_count is not None and cnt < min_count:
            keep[inverse == j] = False
            rare[c] = cnt
        elif max_count is not None and cnt > max_count:
            members = np.flatnonzero(inverse == j)
            drop = rng.permutation(members)[max_count:]
            keep[drop] = False
            capped[c] = cnt - max_count
    kept = np.flatnonzero(keep).astype(np.int64)
    report = FrequencyReport("label", n, len(kept), min_count, max_count, rare, capped)
    return kept, report


def _filter_chars(
    texts: list[str], min_count: int | None, max_count: int | None, seed: int
) -> tuple[np.ndarray, FrequencyReport]:
    n = len(texts)
    counts: Counter[str] = Counter()
    for t in texts:
        counts.update(t)
    keep = np.ones(n, dtype=bool)
    rare: dict = {}
    capped: dict = {}
    if min_count is not None:
        rare_chars = {ch for ch, c in counts.items() if c < min_count}
        for i, t in enumerate(texts):
            bad = [ch for ch in t if ch in rare_chars]
            if bad:
                keep[i] = False
                first = bad[0]
                rare[first] = rare.get(first, 0) + 1
    if max_count is not None:
        cand = np.flatnonzero(keep)
        tiebreak = stream_rng(seed, _DOMAIN_FILTER, 1).random(len(cand))
        rarity = np.asarray([min((counts[ch] for ch in texts[i]), default=0) for i in cand])
        order = cand[np.lexsort((tiebreak, rarity))]
        used: Counter[str] = Counter()
        for i in order.tolist():
            need = Counter(texts[i])
            over = [ch for ch, k in need.items() if used[ch] + k > max_count]
            if over:
                keep[i] = False
                capped[over[0]] = capped.get(over[0], 0) + 1
            else:
                used.update(need)
    kept = np.flatnonzero(keep).astype(np.int64)
    return kept, FrequencyReport("char", n, len(kept), min_count, max_count, rare, capped)
