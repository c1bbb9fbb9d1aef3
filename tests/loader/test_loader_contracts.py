"""The loader's contracts with the rooms around it: ``Loader.slots``, ``Loader.start_method``,
``Source.share()``, ``Source.reader(indices)``, the state schema and the folder walk."""

from __future__ import annotations

import json
import multiprocessing
import os

import numpy as np
import pytest
from loader_helpers import STATE_FIELDS, make_folder

from stoker import IncompatibleStateError
from stoker.loader import FolderSource, Loader, Source
from stoker.loader._state import STATE_VERSION, LoaderState


class _Plain(Source):
    """The smallest source: ``read`` and friends only, images made from the position (so it
    pickles as its length alone)."""

    encoded = False

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def key(self, i):
        return int(i)

    def keys(self):
        return np.arange(self.n, dtype=np.int64)

    def labels(self):
        return np.arange(self.n, dtype=np.int64) % 5

    def read(self, i):
        return np.full((12, 10, 3), i % 256, dtype=np.uint8), int(i % 5)

    @property
    def sample_spec(self):
        from stoker import ArraySpec

        return ArraySpec((12, 10, 3), "uint8")

    def fingerprint(self):
        return {"type": "plain", "len": self.n}


@pytest.mark.parametrize("prefetch", [1, 2, 5])
def test_slots_is_the_ring_size_and_the_ring_is_made_with_it(arrays, prefetch):
    x, y = arrays
    with Loader((x, y), batch_size=4, workers=1, prefetch=prefetch) as ld:
        assert ld.slots == prefetch + 2
        with pytest.raises(AttributeError):
            ld.slots = 3  # type: ignore[misc]
        next(iter(ld))
        assert ld._layout is not None and ld._layout.slots == ld.slots


def test_start_method_names_how_workers_start(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=4, workers=0) as ld:
        assert ld.start_method is None
    with Loader((x, y), batch_size=4, workers=1) as ld:
        assert isinstance(ld.start_method, str)
        assert ld.start_method in multiprocessing.get_all_start_methods()
        expected = (
            "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        )
        assert ld.start_method == expected
        next(iter(ld))
        assert len(ld.worker_pids()) == 1


def test_source_share_is_a_no_op_by_default_and_the_base_reader_takes_indices():
    src = _Plain(60)
    assert src.share() is None  # nothing to do: the source pickles as itself
    get = src.reader(np.array([3, 4], dtype=np.int64))
    payload, label, key, fields = get(3)
    np.testing.assert_array_equal(payload, np.full((12, 10, 3), 3, dtype=np.uint8))
    assert (label, key, fields) == (3, 3, {})
    with Loader(src, batch_size=10, workers=0) as local:
        want = [b.images.copy() for b in local]
    with Loader(src, batch_size=10, workers=2) as ld:  # share() is called, and does nothing
        got = [b.images.copy() for b in ld]
    assert len(got) == len(want) == 6
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def _good_state() -> dict:
    return LoaderState(
        dataset={"type": "arrays", "len": 3},
        sampler={"type": "EpochOrder"},
        seed=1,
        batch_size=4,
        pair=False,
        epoch=2,
        batch=1,
        bad_epoch=0,
        bad_total=5,
    ).to_dict()


def test_state_schema_round_trips_through_json():
    state = _good_state()
    assert state["version"] == STATE_VERSION
    assert tuple(state) == STATE_FIELDS
    back = LoaderState.from_dict(json.loads(json.dumps(state)))
    assert back.to_dict() == state
    assert (back.bad_epoch, back.bad_total) == (0, 5)


@pytest.mark.parametrize(
    "change,exc,match",
    [
        ({"version": STATE_VERSION + 1}, IncompatibleStateError, "version"),
        ({"version": "1"}, TypeError, "version"),
        ({"seed": -1}, ValueError, "seed"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"batch_size": 1 << 25}, ValueError, "batch_size"),
        ({"epoch": 1 << 60}, ValueError, "epoch"),
        ({"batch": -1}, ValueError, "batch"),
        ({"bad": {"epoch": 0}}, ValueError, "bad"),
        ({"bad": {"epoch": 0, "total": 1.0}}, TypeError, "bad.total"),
        ({"pair": 1}, TypeError, "pair"),
        ({"dataset": []}, TypeError, "dataset"),
        ({"sampler": "x"}, TypeError, "sampler"),
        ({"other": 1}, ValueError, "unknown fields"),
        ({"dataset": {"big": "x" * (2 << 20)}}, ValueError, "1 MiB"),
        ({"seed": object()}, ValueError, "JSON-safe"),
    ],
)
def test_state_schema_from_dict_refuses_naming_the_field(change, exc, match):
    state = dict(_good_state(), **change)
    with pytest.raises(exc, match=match):
        LoaderState.from_dict(state)


def test_state_schema_refuses_a_missing_field_and_a_non_dict():
    state = _good_state()
    del state["batch"]
    with pytest.raises(ValueError, match="lacks fields \\['batch'\\]"):
        LoaderState.from_dict(state)
    with pytest.raises(TypeError, match="state must be a dict"):
        LoaderState.from_dict([])


def test_folder_source_needs_class_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        FolderSource(tmp_path / "missing")
    flat = tmp_path / "flat"
    flat.mkdir()
    make_folder(str(tmp_path / "classes"), n=6)
    for name in os.listdir(tmp_path / "classes" / "class_0"):  # images, but no class folder
        os.rename(tmp_path / "classes" / "class_0" / name, flat / name)
    assert os.listdir(flat)
    with pytest.raises(FileNotFoundError, match="no images"):
        FolderSource(flat)
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no images"):
        FolderSource(tmp_path / "empty")


def test_folder_source_lists_files_as_the_shared_walk_does(tmp_path):
    from stoker._core.files import scan_folder

    root = tmp_path / "imgs"
    make_folder(str(root), n=9)
    (root / "class_1" / "deeper").mkdir()
    (root / "class_1" / "deeper" / "x.jpg").write_bytes(b"not read here")
    (root / "class_1" / ".hidden.jpg").write_bytes(b"skipped")
    (root / "class_1" / "notes.txt").write_bytes(b"skipped")
    src = FolderSource(root)
    scan = scan_folder(root)
    assert src.listing == [it.rel for it in scan.items]
    assert src.class_names == sorted(scan.classes)
    assert src.labels().dtype == np.int64
    assert src.labels().tolist() == [int(it.label) for it in scan.items]
    assert "class_1/deeper/x.jpg" in src.listing
    assert not any(f.endswith((".hidden.jpg", "notes.txt")) for f in src.listing)
