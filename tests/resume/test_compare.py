"""The comparison of delivered samples with an uninterrupted run, on made-up logs: exact
epochs (rank by rank, place by place) and elastic ones (the epoch as a whole)."""

from __future__ import annotations

import numpy as np

from stoker.resume._compare import compare_epoch_elastic, compare_epoch_exact
from stoker.resume._run import RECORD


def _log(indices_by_rank: list[list[int]], world: int, batch_size: int = 2) -> np.ndarray:
    rows = []
    for rank, idx in enumerate(indices_by_rank):
        for p, i in enumerate(idx):
            r = np.zeros(1, RECORD)
            r["rank"], r["world"], r["index"], r["key"] = rank, world, i, 100 + i
            r["batch"], r["row"] = divmod(p, batch_size)
            r["pixels"] = i.to_bytes(16, "little")
            r["fields"] = (1000 + i).to_bytes(16, "little")
            rows.append(r)
    return np.concatenate(rows)


def _none(log: np.ndarray) -> np.ndarray:
    return np.full(len(log), -1, np.int64)


REF = _log([[0, 2, 4, 6], [1, 3, 5, 7]], world=2)


def test_an_exact_epoch_matches_itself():
    assert compare_epoch_exact(REF, _none(REF), REF, 0, 2) is None


def test_exact_names_the_earliest_place_and_why():
    got = REF.copy()
    got["pixels"][6] = b"x" * 16  # rank 1, place 2
    got["index"][3] = 9  # rank 0, place 3
    d = compare_epoch_exact(got, np.full(len(got), 4), REF, 0, 2)
    assert (d.why, d.rank, d.batch, d.row, d.resumed_from) == ("pixels", 1, 1, 0, 4)
    got["fields"][1] = b"y" * 16  # rank 0, place 1: earlier
    d = compare_epoch_exact(got, _none(got), REF, 0, 2)
    assert (d.why, d.rank, d.expected_index) == ("fields", 0, 2)
    short = np.delete(REF, 3)  # rank 0 ends a sample early
    d = compare_epoch_exact(short, _none(short), REF, 0, 2)
    assert (d.why, d.rank, d.expected_index, d.got_index) == ("missing", 0, 6, None)


def test_elastic_takes_any_order_but_every_sample_once_with_its_pixels():
    got = _log([[7, 5, 3], [1, 6, 4], [2, 0, 0]], world=3)  # one repeat: the new padding
    assert (
        compare_epoch_elastic(got, _none(got), REF, 0, new_world=3, batch_size=2, drop_last=False)
        is None
    )
    bad = got.copy()
    bad["pixels"][4] = b"z" * 16
    d = compare_epoch_elastic(bad, _none(bad), REF, 0, new_world=3, batch_size=2, drop_last=False)
    assert (d.why, d.got_index, d.expected_index) == ("pixels", 6, 6)
    lost = got[got["index"] != 5]
    d = compare_epoch_elastic(lost, _none(lost), REF, 0, new_world=3, batch_size=2, drop_last=False)
    assert (d.why, d.expected_index) == ("missing", 5)
    assert (
        compare_epoch_elastic(lost, _none(lost), REF, 0, new_world=3, batch_size=2, drop_last=True)
        is None
    )
    foreign = got.copy()
    foreign["index"][2] = 40
    d = compare_epoch_elastic(
        foreign, _none(foreign), REF, 0, new_world=3, batch_size=2, drop_last=False
    )
    assert (d.why, d.got_index) == ("extra", 40)
    twice = np.concatenate([got, got[:3]])
    d = compare_epoch_elastic(
        twice, _none(twice), REF, 0, new_world=3, batch_size=2, drop_last=False
    )
    assert d.why == "repeated"
