"""What RecordIO's reader (``RecordIOReader``, a ``ShardedReader``) has for every set: its
shards (``RecordIOShard`` over a ``RecordFile``), ``manifest``, ``class_names``, the
insightface layout of a set of one shard, and the reader of a chunk."""

from __future__ import annotations

import pickle

import numpy as np
from _recordio_util import face_set, payload, write_rec, write_shards

from stoker.formats.recordio import RecordFile
from stoker.formats.recordio.seam import RecordIOReader
from stoker.formats.recordio.shard import RecordIOShard


def test_a_single_file_is_its_own_one_shard(tmp_path):
    rec = write_rec(tmp_path, [payload(i) for i in range(4)])
    with RecordIOReader(rec) as r:
        assert r.shard_sizes().tolist() == [4] and r.files() == [rec]
        sh = r.shard(0)
        assert isinstance(sh, RecordIOShard) and isinstance(sh._file(), RecordFile)
        assert sh._file().path == rec
        assert r.manifest is None and r.class_names is None
        assert r.identity_table() is None and sh.layout is None
        assert r.reader(np.arange(4))(0)[2] == 0
        copy = pickle.loads(pickle.dumps(r))
        try:
            assert copy.files() == [rec] and len(copy) == 4
        finally:
            copy.close()


def test_a_manifest_set_lists_its_shards_in_position_order(tmp_path):
    mpath, ps = write_shards(tmp_path, [3, 2])
    with RecordIOReader(mpath) as r:
        want = [str(tmp_path / "train-00000.rec"), str(tmp_path / "train-00001.rec")]
        assert r.files() == want
        assert [r.shard(j)._file().path for j in range(2)] == want
        assert r.shard_sizes().tolist() == [3, 2] and len(r) == len(ps)
        assert r.manifest is not None and r.manifest["records"] == 5
        assert r.class_names == ["cat", "dog", "emu"]
        assert r.identity_table() is None
        get = r.reader(np.arange(5))  # several shards: each sample's shard found first
        assert [get(i)[2] for i in range(5)] == r.keys().tolist()
        copy = pickle.loads(pickle.dumps(r))
        try:
            assert copy.files() == r.files()
        finally:
            copy.close()


def test_a_one_shard_manifest_gives_a_file_with_its_manifest(tmp_path):
    mpath, _ = write_shards(tmp_path, [3])
    with RecordIOReader(mpath) as r:
        assert r.shard_sizes().tolist() == [3]
        assert r.shard(0)._file().manifest is not None
        assert r.manifest is not None and r.class_names == ["cat", "dog", "emu"]


def test_the_image_records_of_an_insightface_set_keep_the_contract(tmp_path):
    rec = tmp_path / "faces.rec"
    face_set(rec, per_identity=(2, 3))
    with RecordIOReader(rec) as r:
        assert len(r) == 5 and len(r.shard(0)._file()) == 8
        assert r.shard_sizes().tolist() == [5]
        assert r.manifest is None and r.class_names is None
        assert r.identity_table()["identities"][0]["start_key"] == 1
        assert r.keys().tolist() == [1, 2, 3, 4, 5]
        assert [r.reader(np.arange(5))(i)[2] for i in range(5)] == [1, 2, 3, 4, 5]


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
