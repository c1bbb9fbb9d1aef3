"""A set's label kind is stated in its manifest, never inferred from its records: every pack
declares it (int64 class ids for a folder, whatever a listing's labels are), and a record whose
IRHeader label does not fit it (2.5 or 1e30 in an int64 set, under a valid CRC) is named by
`stoker verify`, raised or skipped by the loader (``on_error``), and never turns the set's
labels float32. A set without a manifest still has its kind inferred from every label."""

from __future__ import annotations

import json

import numpy as np
import pytest
import simplejpeg
from _cli_util import verify_json

from stoker._core.errors import CorruptRecordError
from stoker._core.schema import Schema
from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.formats.recordio.manifest import make_manifest, shard_entry, write_manifest
from stoker.loader import Loader
from stoker.loader.sources.records import RecordSource
from stoker.pack import make_sample_data, pack


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return simplejpeg.encode_jpeg(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))


def _set(tmp_path, labels: list[float], schema: Schema | None, classes=None) -> tuple[str, list]:
    """A one-shard RecordIO set of ``labels`` with a manifest declaring ``schema``; its path
    and each record's byte offset."""
    mpath = str(tmp_path / "s.stoker.json")
    w = RecordWriter(str(tmp_path / "s.rec"), checksums=True)
    for k, lab in enumerate(labels):
        w.write(k, pack_header(IRHeader(0, lab, k, 0), _jpeg(k)))
    info = w.commit()
    extra = {"schema": schema.to_json()} if schema is not None else {}
    write_manifest(mpath, make_manifest([shard_entry(info, mpath)], classes=classes, **extra))
    with open(tmp_path / "s.idx") as f:
        return mpath, [int(line.split("\t")[1]) for line in f]


@pytest.mark.parametrize("fmt", ["recordio", "tfrecord", "wds"])
def test_every_pack_declares_its_label_kind(tmp_path, fmt):
    make_sample_data(tmp_path / "imgs", classes=3, per_class=4, size=32)
    pack(tmp_path / "imgs", tmp_path / "out", format=fmt, workers=1, progress=False)
    with open(tmp_path / "out.stoker.json") as f:
        declared = Schema.from_json(json.load(f)["schema"])
    assert declared == Schema.classification((), "int64")
    with Loader(str(tmp_path / "out.stoker.json"), batch_size=6, shuffle=False) as ld:
        labels = np.concatenate([np.asarray(b.labels) for b in ld])
    assert labels.dtype == np.int64 and sorted(set(labels.tolist())) == [0, 1, 2]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_label_that_is_not_the_declared_kind_is_a_corrupt_record(tmp_path, workers):
    labels = [0.0, 1.0, 2.5, 2.0, 1e30, 1.0]
    bad = (2, 4)
    mpath, offsets = _set(tmp_path, labels, Schema.classification((), "int64"))
    src = RecordSource(mpath)
    got = src.labels()
    assert got.dtype == np.int64  # two bad labels do not make the set float32
    assert got.tolist() == [0, 1, -1, 2, -1, 1]
    kw = dict(batch_size=3, workers=workers, shuffle=False)
    with Loader(mpath, on_error="skip", max_bad_fraction=0.5, **kw) as ld:
        read = {int(k): lab for b in ld for k, lab in zip(b.keys, np.asarray(b.labels))}
        assert sorted(r["key"] for r in ld.rejects) == list(bad)
        assert all("not a whole number within int64" in r["reason"] for r in ld.rejects)
    assert read == {k: int(labels[k]) for k in range(len(labels)) if k not in bad}
    with Loader(mpath, **kw) as ld:
        with pytest.raises(CorruptRecordError, match=f"key 2, byte offset {offsets[2]}"):
            list(ld)
    rc, rep = verify_json(mpath)
    assert rc == 1
    assert [(p["key"], p["offset"]) for p in rep["problems"]] == [(k, offsets[k]) for k in bad]


def test_a_label_outside_the_manifests_classes_is_a_corrupt_record(tmp_path):
    # a manifest of an earlier version: classes and no schema, so int64 class ids 0..2
    mpath, offsets = _set(tmp_path, [0.0, 1.0, 7.0, 2.0], None, classes={"a": 0, "b": 1, "c": 2})
    assert RecordSource(mpath).labels().tolist() == [0, 1, -1, 2]
    with Loader(mpath, batch_size=2, shuffle=False, on_error="skip", max_bad_fraction=0.5) as ld:
        keys = [int(k) for b in ld for k in b.keys]
        assert [r["key"] for r in ld.rejects] == [2]
        assert "is not a class id (the manifest names 3" in ld.rejects[0]["reason"]
    assert keys == [0, 1, 3]


def test_declared_float_labels_stay_float_when_every_one_is_whole(tmp_path):
    mpath, _ = _set(tmp_path, [1.0, 2.0, 3.0], Schema.classification((), "float32"))
    with Loader(mpath, batch_size=3, shuffle=False) as ld:
        (batch,) = list(ld)
    assert np.asarray(batch.labels).dtype == np.float32
    assert np.asarray(batch.labels).tolist() == [1.0, 2.0, 3.0]


def test_a_set_without_a_manifest_infers_its_kind_from_every_label(tmp_path):
    for sub, labels, dtype in (("a", [1.0, 2.0, 3.0], np.int64), ("b", [1.0, 2.5], np.float32)):
        (tmp_path / sub).mkdir()
        _set(tmp_path / sub, labels, None)
        assert RecordSource(str(tmp_path / sub / "s.rec")).labels().dtype == dtype
