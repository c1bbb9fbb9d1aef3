"""NAME.stoker.json: schema, JSON only (never unpickled), size cap, files checked against it,
several shards read as one."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
from _recordio_util import header_of, image, payload, write_rec, write_shards

from stoker._core.errors import ManifestError
from stoker.formats.recordio import (
    RecordFile,
    load_manifest,
    make_manifest,
    shard_entry,
    verify_records,
    write_manifest,
)
from stoker.formats.recordio.seam import RecordIOReader


def test_manifest_round_trip_and_relative_paths(tmp_path):
    mpath, _ = write_shards(tmp_path, [3])
    m = load_manifest(mpath)
    assert (m["format"], m["version"], m["kind"], m["records"]) == ("stoker", 2, "recordio", 3)
    s = m["shards"][0]
    assert s.files == {
        "data": "train-00000.rec",
        "index": "train-00000.idx",
        "crc": "train-00000.crc32c",
    }
    assert s.bytes == os.path.getsize(tmp_path / "train-00000.rec")
    with RecordFile(str(tmp_path / "train-00000.rec")) as r:
        assert s.checksums["index.sha256"] == r.idx_sha256
    with open(mpath) as f:
        assert json.load(f) == {**m, "shards": [s.to_json()]}


def test_single_shard_opens_as_record_file_with_classes(tmp_path):
    mpath, ps = write_shards(tmp_path, [4])
    for target in (mpath, tmp_path / "train-00000.rec", tmp_path / "train-00000.idx"):
        with RecordIOReader(target) as r:
            assert isinstance(r.shard(0)._file(), RecordFile) and r.shard_sizes().tolist() == [4]
            assert [bytes(r.read(i)[0]) for i in range(len(r))] == [image(p) for p in ps]
            if target == mpath:
                assert r.class_names == ["cat", "dog", "emu"]
                assert r.manifest["pack"]["workers"] == 2


def test_rec_beside_its_manifest_picks_up_classes(tmp_path):
    rec = write_rec(tmp_path, [payload(i) for i in range(3)], name="solo")
    from stoker.formats.recordio import ShardInfo

    with RecordFile(rec) as r:
        sha = r.idx_sha256
    info = ShardInfo(rec, rec[:-4] + ".idx", rec[:-4] + ".crc32c", 3, os.path.getsize(rec), sha)
    mp = tmp_path / "solo.stoker.json"
    write_manifest(mp, make_manifest([shard_entry(info, mp)], classes={"a": 1, "b": 0}))
    with RecordIOReader(rec) as r:
        assert r.class_names == ["b", "a"]


def test_multi_shard_reads_as_one(tmp_path):
    mpath, ps = write_shards(tmp_path, [3, 0, 5, 2])
    with RecordIOReader(mpath, checksums=True) as r:
        assert len(r) == 10 and r.shard_sizes().tolist() == [3, 0, 5, 2]
        assert [bytes(r.read(i)[0]) for i in range(10)] == [image(p) for p in ps]
        assert [r.key(i) for i in range(10)] == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1]
        assert [r.where(i)[0] for i in range(10)] == [0, 0, 0, 2, 2, 2, 2, 2, 3, 3]
        assert r.where(-1) == (3, 1)
        assert r.keys().tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1]
        assert r.labels().tolist() == [i % 3 for i in range(10)]
        assert r.labels()[[9, 0, 4]].tolist() == [0, 0, 1]
        assert r.class_names == ["cat", "dog", "emu"] and r.identity_table() is None
        assert header_of(r, 7).id == 7
        r2 = pickle.loads(pickle.dumps(r))
        try:
            assert bytes(r2.read(9)[0]) == image(ps[9])
        finally:
            r2.close()


def test_idx_from_another_rec_is_named(tmp_path):
    mpath, _ = write_shards(tmp_path, [3, 3], same_keys=False)
    # swap in a .idx that belongs to a different .rec (same size, different content)
    other = tmp_path / "other"
    other.mkdir()
    write_rec(other, [payload(50 + i, size=5) for i in range(3)], name="o", checksums=False)
    os.replace(other / "o.idx", tmp_path / "train-00001.idx")
    with RecordIOReader(mpath) as r:  # shards open lazily: checked when first read
        assert bytes(r.read(0)[0])
        with pytest.raises(ManifestError, match="idx does not match rec"):
            r.read(3)
    rep = verify_records(mpath)
    assert any("idx does not match rec" in p.reason for p in rep.problems)


def test_rec_replaced_is_named(tmp_path):
    mpath, _ = write_shards(tmp_path, [2])
    with open(tmp_path / "train-00000.rec", "ab") as f:
        f.write(b"\x00" * 4)
    with pytest.raises(ManifestError, match="replaced or truncated"):
        RecordIOReader(mpath)


def test_an_index_the_manifest_names_but_that_is_gone_is_named_at_open(tmp_path):
    """Found by F-02's fuzz: a manifest whose index name was damaged (or whose .idx was
    lost) raised a bare FileNotFoundError from deep in the open; it is a ManifestError that
    names the manifest, the missing file and its shard, before any shard is opened."""
    import stoker

    mpath, _ = write_shards(tmp_path, [2, 3])
    os.remove(tmp_path / "train-00001.idx")
    for open_ in (RecordIOReader, lambda p: stoker.Loader(p, batch_size=2, workers=0)):
        with pytest.raises(ManifestError) as e:
            open_(mpath)
        msg = str(e.value)
        assert str(mpath) in msg and "train-00001.idx" in msg and "'train-00001.rec'" in msg
        assert "cannot be read" in msg


def test_pickle_named_stoker_json_is_never_unpickled(tmp_path):
    """B9 #78: a pickle whose __reduce__ would create a sentinel file."""
    sentinel = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(sentinel), "w"))

    bad = tmp_path / "x.stoker.json"
    bad.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ManifestError, match="not a JSON manifest"):
        load_manifest(bad)
    with pytest.raises(ManifestError):
        RecordIOReader(bad)
    with pytest.raises(ManifestError):
        verify_records(bad)
    assert not sentinel.exists()


def test_oversized_manifest_refused_before_parsing(tmp_path, monkeypatch):
    """B9 #82: the size cap is checked from the file size, before reading."""
    big = tmp_path / "big.stoker.json"
    with open(big, "wb") as f:
        f.truncate(65 << 20)  # sparse: 65 MiB of zeros, costs no disk
    reads = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda *a, **k: reads.append(1) or real_loads(*a, **k))
    with pytest.raises(ManifestError, match="over the"):
        load_manifest(big)
    assert reads == []
    small = tmp_path / "s.stoker.json"
    small.write_text(json.dumps({"format": "stoker-recordio"}) + " " * 200)
    with pytest.raises(ManifestError, match="over the 100-byte cap"):
        load_manifest(small, max_bytes=100)


def test_deeply_nested_json_is_refused(tmp_path):
    p = tmp_path / "deep.stoker.json"
    p.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ManifestError):
        load_manifest(p)


GOOD_SHARD = {
    "rec": "a.rec",
    "idx": "a.idx",
    "records": 2,
    "rec_bytes": 64,
    "idx_sha256": "0" * 64,
    "crc32c": None,
}


@pytest.mark.parametrize(
    ("patch", "msg"),
    [
        ({"format": "tfrecord"}, "format 'tfrecord' is not one stoker reads"),
        ({"version": 2}, "version 2 is not supported"),
        ({"version": True}, "version True"),
        ({"records": 3}, "records is 3 but the shards hold 2"),
        ({"shards": "a.rec"}, "shards must be a list"),
        ({"shards": [dict(GOOD_SHARD, rec="/etc/passwd")]}, "must stay inside"),
        ({"shards": [dict(GOOD_SHARD, idx="../x.idx")]}, "must stay inside"),
        ({"shards": [dict(GOOD_SHARD, records=-2)]}, "non-negative integer"),
        ({"shards": [dict(GOOD_SHARD, idx_sha256="abc")]}, "64 lowercase hex"),
        ({"classes": {"a": 0, "b": 2}}, "class ids must be 0..C-1"),
        ({"classes": {"a": 0, "b": 0}}, "class ids must be 0..C-1"),
        ({"classes": ["a"]}, "classes must be an object"),
        ({"pack": []}, "pack must be an object"),
    ],
)
def test_schema_errors_name_the_field(tmp_path, patch, msg):
    m = {
        "format": "stoker-recordio",
        "version": 1,
        "records": 2,
        "shards": [GOOD_SHARD],
        "classes": {},
        "pack": {},
        "rejects": {},
    }
    m.update(patch)
    p = tmp_path / "m.stoker.json"
    p.write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        load_manifest(p)
    with pytest.raises(ManifestError):
        write_manifest(tmp_path / "w.stoker.json", m)
    assert not (tmp_path / "w.stoker.json").exists()


GOOD_V2 = {"files": {"data": "a.rec", "index": "a.idx"}, "records": 2, "bytes": 64}
GOOD_V2["checksums"] = {"index.sha256": "0" * 64}


@pytest.mark.parametrize(
    ("patch", "msg"),
    [
        ({"kind": "parquet"}, "kind 'parquet' is not a format stoker reads"),
        ({"kind": "wds"}, "describes a wds set, not a recordio one"),
        ({"version": 3}, "version 3 is not supported"),
        ({"records": 3}, "records is 3 but the shards hold 2"),
        ({"shards": [dict(GOOD_V2, files={"data": "a.rec"})]}, "shards[0].files.index is missing"),
        (
            {"shards": [dict(GOOD_V2, files={"data": "/x.rec", "index": "a.idx"})]},
            "shards[0].files.data '/x.rec' must stay inside",
        ),
        (
            {"shards": [dict(GOOD_V2, files={**GOOD_V2["files"], "label": "a.lab"})]},
            "shards[0].files.label: recordio has no role 'label'",
        ),
        ({"shards": [dict(GOOD_V2, bytes=None)]}, "shards[0].bytes must be a non-negative integer"),
        ({"shards": [dict(GOOD_V2, checksums={})]}, "shards[0].checksums.index.sha256 is missing"),
        (
            {"shards": [dict(GOOD_V2, checksums={"index.sha256": "0" * 64, "data.md5": "x"})]},
            "shards[0].checksums.data.md5: a checksum is named ROLE.ALGORITHM",
        ),
        (
            {"shards": [dict(GOOD_V2, checksums={"index.sha256": "0" * 64, "data.crc32c": -1})]},
            "shards[0].checksums.data.crc32c must be an unsigned 32-bit",
        ),
        (
            {"shards": [GOOD_V2, GOOD_V2]},
            "shards[1].files.data 'a.rec' is already shards[0].files.data",
        ),
        ({"options": []}, "options must be an object"),
    ],
)
def test_version_2_errors_name_the_field(tmp_path, patch, msg):
    m = {
        "format": "stoker",
        "version": 2,
        "kind": "recordio",
        "records": 2,
        "shards": [GOOD_V2],
        "classes": {},
    }
    m.update(patch)
    if "shards" in patch and "records" not in patch:
        m["records"] = sum(s["records"] for s in m["shards"])
    p = tmp_path / "m.stoker.json"
    p.write_text(json.dumps(m))
    escaped = msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(ManifestError, match=escaped):
        load_manifest(p)


def test_class_names_survive_awkward_characters(tmp_path):
    names = {"a\tb\n": 0, "caf\u00e9": 1, "latin1-\udce9": 2, "../x": 3}
    rec = write_rec(tmp_path, [payload(0)], name="c")
    with RecordFile(rec) as r:
        sha = r.idx_sha256
    from stoker.formats.recordio import ShardInfo

    info = ShardInfo(rec, rec[:-4] + ".idx", None, 1, os.path.getsize(rec), sha)
    mp = tmp_path / "c.stoker.json"
    write_manifest(mp, make_manifest([shard_entry(info, mp)], classes=names))
    assert mp.read_bytes().isascii()
    assert load_manifest(mp)["classes"] == names


def test_write_manifest_refuses_non_json_values(tmp_path):
    m = make_manifest([], pack={"x": np.float32(1)})
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        write_manifest(tmp_path / "n.stoker.json", m)
