"""Manifests that would read records twice or not at all, folder paths, and records whose
label counts differ: each a ``StokerFormatError`` naming what is wrong."""

from __future__ import annotations

import json
import os

import pytest
from _recordio_util import payload, write_rec, write_shards

from stoker._core.errors import CorruptRecordError, ManifestError, StokerFormatError
from stoker.formats.recordio import RecordFile, load_manifest
from stoker.formats.recordio.seam import RecordIOReader
from stoker.loader.sources import RecordSource


def _edit(mpath, change) -> None:
    with open(mpath) as f:
        m = json.load(f)
    change(m)
    with open(mpath, "w") as f:
        json.dump(m, f)


def test_a_shard_listed_twice_is_refused(tmp_path):
    mpath, _ = write_shards(tmp_path, [3, 2])

    def twice(m):
        m["shards"].append(dict(m["shards"][0]))
        m["records"] += m["shards"][0]["records"]

    _edit(mpath, twice)
    for opener in (load_manifest, RecordIOReader, RecordSource):
        with pytest.raises(ManifestError, match=r"shards\[2\]\.files\.data 'train-00000.rec'") as e:
            opener(mpath)
        assert str(mpath) in str(e.value) and "listed once" in str(e.value)

    def spelled_differently(m):
        m["shards"][2]["files"]["data"] = "./train-00000.rec"

    _edit(mpath, spelled_differently)
    with pytest.raises(ManifestError, match="already shards"):
        load_manifest(mpath)


def test_record_counts_that_disagree_are_refused(tmp_path):
    mpath, _ = write_shards(tmp_path, [3, 2])

    def total(m):
        m["records"] = 6

    _edit(mpath, total)
    with pytest.raises(ManifestError, match="records is 6 but the shards hold 5"):
        RecordIOReader(mpath)

    def shard(m):
        m["records"], m["shards"][1]["records"] = 6, 3

    _edit(mpath, shard)
    with pytest.raises(ManifestError, match="the 3 records of shard 'train-00001.rec' need 12"):
        RecordSource(mpath)  # its .crc32c holds 2 records
    with pytest.raises(ManifestError, match="has 2 records, the manifest says 3"):
        RecordSource(mpath, checksums=False).labels()
    with RecordIOReader(mpath, checksums=False) as r:
        with pytest.raises(ManifestError, match="has 2 records, the manifest says 3"):
            r.read(3)  # shards open lazily: checked when first read


def test_a_folder_named_as_a_shard_file_is_a_manifest_error(tmp_path):
    cases = [("data", "."), ("data", "sub/"), ("index", "."), ("crc", ".")]
    for n, (field, value) in enumerate(cases):
        d = tmp_path / f"c{n}"
        d.mkdir()
        mpath, _ = write_shards(d, [2])

        def point(m, field=field, value=value):
            m["shards"][0]["files"][field] = value

        _edit(mpath, point)
        with pytest.raises(
            ManifestError, match=rf"shards\[0\]\.files\.{field} '{value}' names a folder"
        ):
            RecordIOReader(mpath)
        with pytest.raises(ManifestError, match=str(mpath)):
            RecordSource(mpath)
    for field in ("data", "index", "crc"):
        d = tmp_path / f"d-{field}"
        d.mkdir()
        mpath, _ = write_shards(d, [2])
        os.mkdir(d / "sub")

        def sub(m, field=field):
            m["shards"][0]["files"][field] = "sub"

        _edit(mpath, sub)
        with pytest.raises(
            ManifestError, match=rf"'sub' \(field files\.{field}\) names a directory"
        ):
            RecordIOReader(mpath, checksums=field != "data").read(0)


def test_a_record_with_another_label_count_names_file_key_and_offset(tmp_path):
    ps = [payload(i, size=8) for i in range(6)]
    ps[4] = payload(4, size=8, labels=3)
    rec = write_rec(tmp_path, ps, keys=[10 + i for i in range(6)], checksums=False)
    with RecordFile(rec) as r:
        off = r.offset(4)
        with pytest.raises(CorruptRecordError, match="different label counts") as e:
            r.labels()
        assert isinstance(e.value, StokerFormatError)
        assert (e.value.path, e.value.key, e.value.offset, e.value.idx_line) == (rec, 14, off, 5)
        assert "positions=" not in str(e.value)
    src = RecordSource(rec)
    try:
        with pytest.raises(CorruptRecordError, match=f"key 14, byte offset {off}"):
            src.labels()  # what a Loader asks for before its first batch
    finally:
        src.close()


def test_shards_with_other_label_counts_name_file_key_and_offset(tmp_path):
    mpath, _ = write_shards(tmp_path, [2, 2])
    rec1 = str(tmp_path / "train-00001.rec")
    (tmp_path / "o").mkdir()
    other = write_rec(tmp_path / "o", [payload(i, size=8, labels=2) for i in range(2)])
    for ext in ("rec", "idx", "crc32c"):
        os.replace(other[:-3] + ext, rec1[:-3] + ext)

    def refresh(m):  # the manifest describes the rewritten shard
        with RecordFile(rec1) as r:
            m["shards"][1]["bytes"] = r.size
            m["shards"][1]["checksums"]["index.sha256"] = r.idx_sha256

    _edit(mpath, refresh)
    with RecordIOReader(mpath) as r:
        with pytest.raises(CorruptRecordError, match="different label counts") as e:
            r.labels()
        assert (e.value.path, e.value.key, e.value.offset) == (rec1, 0, 0)
