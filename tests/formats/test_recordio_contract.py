"""What ``RecordSet`` (or ``images()``) returns, a ``RecordSet``, has for every set:
``shards`` (``RecordFile``s), ``manifest``, ``class_names``, the insightface attributes and
``plain_reader``."""

from __future__ import annotations

import pickle

import numpy as np
from _recordio_util import face_set, payload, write_rec, write_shards

from stoker.formats.recordio import RecordFile, RecordSet


def test_a_single_file_is_its_own_one_shard(tmp_path):
    rec = write_rec(tmp_path, [payload(i) for i in range(4)])
    with RecordSet(rec) as r:
        assert isinstance(r, RecordSet)
        assert len(r.shards) == 1 and isinstance(r.shards[0], RecordFile)
        assert r.shards[0].path == rec
        assert r.manifest is None and r.class_names is None
        assert r.identity_ranges is None and r.image_keys is None and r.image_positions is None
        assert r.images() is r
        assert r.plain_reader() is not None
        copy = pickle.loads(pickle.dumps(r))
        try:
            assert [s.path for s in copy.shards] == [rec] and len(copy) == 4
        finally:
            copy.close()


def test_a_manifest_set_lists_its_shards_in_position_order(tmp_path):
    mpath, ps = write_shards(tmp_path, [3, 2])
    with RecordSet(mpath) as r:
        assert isinstance(r, RecordSet)
        assert [s.path for s in r.shards] == [
            str(tmp_path / "train-00000.rec"),
            str(tmp_path / "train-00001.rec"),
        ]
        assert all(isinstance(s, RecordFile) for s in r.shards)
        assert sum(len(s) for s in r.shards) == len(r) == len(ps)
        assert r.manifest is not None and r.manifest["records"] == 5
        assert r.class_names == ["cat", "dog", "emu"]
        assert r.identity_ranges is None and r.image_keys is None and r.image_positions is None
        assert r.images() is r
        assert r.plain_reader() is None  # several shards: callers read with read_header
        copy = pickle.loads(pickle.dumps(r))
        try:
            assert [s.path for s in copy.shards] == [s.path for s in r.shards]
        finally:
            copy.close()


def test_a_one_shard_manifest_gives_a_file_with_its_manifest(tmp_path):
    mpath, _ = write_shards(tmp_path, [3])
    with RecordSet(mpath) as r:
        assert len(r.shards) == 1 and isinstance(r.shards[0], RecordFile)
        assert r.shards[0].manifest is r.manifest
        assert r.manifest is not None and r.class_names == ["cat", "dog", "emu"]


def test_the_image_records_of_an_insightface_set_keep_the_contract(tmp_path):
    rec = tmp_path / "faces.rec"
    face_set(rec, per_identity=(2, 3))
    with RecordSet(rec) as r:
        imgs = r.images()
        assert isinstance(imgs, RecordSet) and len(imgs) == 5 and len(r) == 8
        assert list(imgs.shards) == list(r.shards)
        assert imgs.manifest is None and imgs.class_names is None
        np.testing.assert_array_equal(imgs.identity_ranges, r.identity_ranges)
        np.testing.assert_array_equal(imgs.image_keys, [1, 2, 3, 4, 5])
        assert imgs.plain_reader() is not None


def test_open_records_is_deprecated_and_gives_the_reader(tmp_path):
    import pytest

    import stoker
    from stoker.formats import Reader

    mpath, _ = write_shards(tmp_path, [3, 2])
    with pytest.warns(DeprecationWarning, match="stoker.formats.open"):
        r = stoker.open_records(mpath, verify_checksums="auto")
    try:
        assert isinstance(r, Reader) and len(r) == 5 and r.checksums
        with stoker.formats.open(mpath) as same:
            np.testing.assert_array_equal(r.keys(), same.keys())
            np.testing.assert_array_equal(r.labels(), same.labels())
    finally:
        r.close()
