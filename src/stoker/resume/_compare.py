"""The samples a killed and resumed run delivered, against the uninterrupted run's.

An epoch delivered on one world size throughout is compared rank by rank and position by
position: the same index, the same pixels, the same label and fields, in the same order. The
epoch in which a state saved on *N* ranks resumed on *M* is compared as a whole: every sample
of the uninterrupted *N*-rank epoch delivered (all of them, or with ``drop_last`` all but
fewer than *M* batches), nothing from outside it, no sample more often than the declared
padding allows, and each with the pixels and fields it has in the uninterrupted run (a
sample's augmentation depends on (seed, epoch, index) only, never on its rank or batch).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Difference", "compare_epoch_exact", "compare_epoch_elastic"]

_WHY = {
    "index": "a different sample",
    "pixels": "the same sample with other pixels",
    "fields": "the same sample and pixels with another label or other fields",
    "missing": "a sample of the uninterrupted run that was never delivered",
    "extra": "a sample delivered beyond the uninterrupted run's",
    "repeated": "a sample delivered more often than the padding allows",
}


@dataclass(frozen=True)
class Difference:
    """The first delivered sample that is not the uninterrupted run's.

    ``why``: ``"index"`` (another sample at that place), ``"pixels"`` (the same index with
    other pixels), ``"fields"`` (the same index and pixels, another label or field),
    ``"missing"``, ``"extra"`` or ``"repeated"``. ``expected_*`` / ``got_*`` name the sample
    (global index and record key; ``None`` where there is none). ``resumed_from``: the step of
    the state the run that delivered it had resumed from (``None``: it had not resumed).
    """

    why: str
    epoch: int
    rank: int | None
    world_size: int
    batch: int | None
    row: int | None
    expected_index: int | None = None
    expected_key: int | None = None
    got_index: int | None = None
    got_key: int | None = None
    resumed_from: int | None = None

    def describe(self) -> str:
        where = f"epoch {self.epoch}"
        if self.rank is not None:
            where += f", rank {self.rank} of {self.world_size}"
        if self.batch is not None:
            where += f", batch {self.batch}, row {self.row}"
        exp = _name(self.expected_index, self.expected_key)
        got = _name(self.got_index, self.got_key)
        if self.why == "index":
            what = f"expected {exp}, got {got}"
        elif self.why == "missing":
            what = f"{exp} (nothing delivered in its place)" if self.batch is not None else exp
        else:
            what = got
        after = (
            f"; delivered after the resume from the state of step {self.resumed_from}"
            if self.resumed_from is not None
            else "; delivered before any kill, so the pipeline does not give the same samples "
            "twice even without a resume (a random draw not from the rng handed to the "
            "transforms, or state kept between calls?)"
        )
        return f"{where}: {_WHY[self.why]}: {what}{after if self.got_index is not None else ''}"

    def to_dict(self) -> dict:
        return {**asdict(self), "message": self.describe()}


def _name(index: int | None, key: int | None) -> str:
    if index is None:
        return "nothing"
    return f"index {index} (key {key})"


def _row(rec: np.void | None) -> tuple[int | None, int | None]:
    return (None, None) if rec is None else (int(rec["index"]), int(rec["key"]))


def compare_epoch_exact(
    got: np.ndarray,
    resumed: np.ndarray,
    expected: np.ndarray,
    epoch: int,
    world: int,
    *,
    partial: bool = False,
) -> Difference | None:
    """The first place, over the ranks of one epoch, where ``got`` (with ``resumed``, the
    resume step of the run that delivered each row, -1 for none) is not ``expected``.
    ``partial``: the run stopped within this epoch, so each rank's deliveries need only be a
    beginning of the expected ones."""
    best: tuple[int, int, Difference] | None = None
    for rank in range(world):
        g_sel = got["rank"] == rank
        g, res = got[g_sel], resumed[g_sel]
        x = expected[expected["rank"] == rank]
        n = min(len(g), len(x))
        bad = (
            (g["index"][:n] != x["index"][:n])
            | (g["pixels"][:n] != x["pixels"][:n])
            | (g["fields"][:n] != x["fields"][:n])
        )
        hits = np.flatnonzero(bad)
        if hits.size:
            p = int(hits[0])
            gi, xi = g[p], x[p]
            if gi["index"] != xi["index"]:
                why = "index"
            else:
                why = "pixels" if gi["pixels"] != xi["pixels"] else "fields"
            diff = _diff(why, epoch, rank, world, xi, gi, res[p], at_expected=True)
        elif len(g) != len(x) and not (partial and len(g) < len(x)):
            p = n
            if len(g) < len(x):
                diff = _diff("missing", epoch, rank, world, x[p], None, -1)
            else:
                diff = _diff("extra", epoch, rank, world, None, g[p], res[p], at_expected=True)
        else:
            continue
        if best is None or (p, rank) < best[:2]:
            best = (p, rank, diff)
    return None if best is None else best[2]


def _diff(
    why: str,
    epoch: int,
    rank: int | None,
    world: int,
    exp: np.void | None,
    got: np.void | None,
    resumed: int,
    *,
    at_expected: bool = False,
) -> Difference:
    """``at_expected``: name the place the expected sample has in the uninterrupted run (an
    epoch on one world size), else the place of the delivered one."""
    where = exp if (at_expected and exp is not None) or got is None else got
    xi, xk = _row(exp)
    gi, gk = _row(got)
    return Difference(
        why=why,
        epoch=epoch,
        rank=rank if where is not None else None,
        world_size=int(where["world"]) if where is not None else world,
        batch=int(where["batch"]) if where is not None else None,
        row=int(where["row"]) if where is not None else None,
        expected_index=xi,
        expected_key=xk,
        got_index=gi,
        got_key=gk,
        resumed_from=None if resumed < 0 else int(resumed),
    )


def compare_epoch_elastic(
    got: np.ndarray,
    resumed: np.ndarray,
    expected: np.ndarray,
    epoch: int,
    *,
    new_world: int,
    batch_size: int,
    drop_last: bool,
    partial: bool = False,
) -> Difference | None:
    """One epoch resumed on another number of ranks, against the uninterrupted epoch (see
    the module docstring); the first problem in delivery order. ``partial``: the run stopped
    within this epoch, so samples not yet delivered are not missing."""
    old_world = int(expected["world"][0]) if len(expected) else new_world
    uniq, first = np.unique(expected["index"], return_index=True)
    ref = expected[first]  # one row per sample of the epoch, sorted by index
    pos = np.searchsorted(uniq, got["index"])
    pos_c = np.minimum(pos, max(len(uniq) - 1, 0))
    inside = (pos < len(uniq)) & (uniq[pos_c] == got["index"]) if len(uniq) else pos < 0
    same_px = inside & (ref["pixels"][pos_c] == got["pixels"])
    same_f = same_px & (ref["fields"][pos_c] == got["fields"])
    hits = np.flatnonzero(~same_f)
    if hits.size:
        p = int(hits[0])
        g = got[p]
        if not inside[p]:
            return _diff("extra", epoch, int(g["rank"]), new_world, None, g, int(resumed[p]))
        why = "pixels" if not same_px[p] else "fields"
        return _diff(why, epoch, int(g["rank"]), new_world, ref[pos_c[p]], g, int(resumed[p]))
    seen = np.zeros(len(uniq), np.int64)
    np.add.at(seen, pos_c, 1)
    missing = np.flatnonzero(seen == 0)
    allowed = (new_world * batch_size - 1) if drop_last else 0
    if len(missing) > allowed and not partial:
        # the first one the uninterrupted run delivered
        order = np.argsort(first[missing], kind="stable")
        x = ref[missing[order[0]]]
        return _diff("missing", epoch, None, old_world, x, None, -1)
    repeats_allowed = (len(expected) - len(uniq)) + (new_world - 1)
    if len(got) - int((seen > 0).sum()) > repeats_allowed:
        over = np.flatnonzero(seen > 1)
        counts = np.zeros(len(uniq), np.int64)
        for p in range(len(got)):  # the delivery that went over first
            counts[pos_c[p]] += 1
            if counts[pos_c[p]] > 1 and pos_c[p] in over:
                g = got[p]
                return _diff("repeated", epoch, int(g["rank"]), new_world, None, g, int(resumed[p]))
    return None
