"""The WebDataset shard writer: atomic output, resume after a kill, what it refuses, the set
manifest, and a pack through the registry."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from _wds_util import jpeg

from stoker._core.errors import ManifestError, SpecError
from stoker._core.schema import Field, Schema
from stoker.formats.wds import WdsShardWriter, open_reader, open_writer, verify, write_set_manifest

SCHEMA = Schema(
    {
        "image": Field.image(),
        "label": Field.numeric((), "int64", header=True),
        "txt": Field.text(),
        "pts": Field.points(),
    }
)


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


def fields(i: int) -> dict:
    return {"txt": f"t{i}", "pts": np.full((i % 3, 2), i / 4, np.float32)}


def test_nothing_final_until_commit_and_abort_leaves_nothing(tmp_path):
    w = open_writer(tmp_path / "a", None, schema=SCHEMA)
    w.write(0, jpeg(0), 1, fields(0))
    assert not (tmp_path / "a.tar").exists()
    assert (tmp_path / "a.tar.partial").exists()
    w.abort()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda w: w.write(0, b"GIF? no: plain text", 0, fields(0)), "no type a WebDataset reader"),
        (lambda w: w.write(0, jpeg(0), 1.5, fields(0)), "one whole number"),
        (lambda w: w.write(0, jpeg(0), [1, 2], fields(0)), "one whole number"),
        (lambda w: w.write(0, jpeg(0), 1, {"txt": "x"}), "'pts' is missing"),
        (lambda w: w.write(0, jpeg(0), 1, {**fields(0), "txt": 3}), "expects a str"),
        (lambda w: w.write(-1, jpeg(0), 1, fields(0)), "must be in"),
    ],
    ids=["not-an-image", "fraction", "vector", "missing-field", "wrong-kind", "negative-key"],
)
def test_write_refuses_clearly(tmp_path, call, match):
    w = open_writer(tmp_path / "x", None, schema=SCHEMA)
    try:
        with pytest.raises(ValueError, match=match):
            call(w)
    finally:
        w.abort()


def test_duplicate_keys_and_unstorable_schemas(tmp_path):
    w = open_writer(tmp_path / "d", None, schema=SCHEMA)
    w.write(3, jpeg(3), 0, fields(3))
    with pytest.raises(ValueError, match="key 3 is written twice"):
        w.write(3, jpeg(3), 0, fields(3))
    w.abort()
    multi = Schema({"image": Field.image(), "y": Field.numeric((3,), "float32", header=True)})
    with pytest.raises(SpecError, match="one integer class per sample"):
        open_writer(tmp_path / "m", None, schema=multi)
    clash = Schema({"image": Field.image(), "jpg": Field.text()})
    with pytest.raises(SpecError, match="'.jpg', which is taken"):
        open_writer(tmp_path / "c", None, schema=clash)
    (tmp_path / "e.tar").write_bytes(b"keep me")
    with pytest.raises(FileExistsError):
        WdsShardWriter(tmp_path / "e.tar", schema=SCHEMA)
    assert (tmp_path / "e.tar").read_bytes() == b"keep me"


def test_manifest_checks(tmp_path):
    w = open_writer(tmp_path / "s", 0, schema=SCHEMA)
    w.write(0, jpeg(0), 0, fields(2))
    entry = w.commit()
    m = tmp_path / "s.stoker.json"
    write_set_manifest(m, [entry], schema=SCHEMA)
    with open_reader(m) as r:
        assert r.schema["pts"].max_len == 2 and r.schema["txt"].max_len == 2
    with pytest.raises(ManifestError, match="must stay inside"):
        write_set_manifest(m, [{**entry, "files": {"data": "../s-00000.tar"}}], schema=SCHEMA)
    with pytest.raises(ManifestError, match="listed once"):
        write_set_manifest(m, [entry, entry], schema=SCHEMA)
    text = m.read_text().replace('"records": 1,\n   "bytes"', '"records": 2,\n   "bytes"')
    m.write_text(text)
    with pytest.raises(ManifestError, match="records is 1 but the shards hold 2"):
        open_reader(m)
    os.unlink(m)
    write_set_manifest(m, [entry], schema=SCHEMA)
    Path(tmp_path / "s-00000.tar").write_bytes(b"x" * entry["bytes"])
    report = verify(m)
    assert not report.ok
    assert any("sha256 differs" in p.reason for p in report.problems)


def test_pack_writes_wds_through_the_registry(tmp_path):
    from stoker.pack import pack

    src = tmp_path / "images"
    for c in ("cat", "dog"):
        (src / c).mkdir(parents=True)
        for i in range(3):
            (src / c / f"{i}.jpg").write_bytes(jpeg(i + (10 if c == "dog" else 0), size=16))
    out = tmp_path / "train"
    pack(src, out, format="wds", workers=1)
    m = Path(str(out) + ".stoker.json")
    with open_reader(m) as r:
        assert len(r) == 6
        assert sorted(r.labels().tolist()) == [0, 0, 0, 1, 1, 1]
        assert r.class_names == ["cat", "dog"]
        images = {bytes(r.reader()(i)[0]) for i in range(6)}
    assert images == {jpeg(i + k, size=16) for i in range(3) for k in (0, 10)}
    assert verify(m).ok


def test_captions_survive_convert_to_recordio_and_back(tmp_path):
    """Shards from the webdataset package, converted to RecordIO and back to WebDataset:
    image bytes, labels and captions unchanged, in order."""
    import webdataset as wds
    from _wds_util import image_of, samples

    from stoker.pack import convert

    data = samples(7)
    src = tmp_path / "src.tar"
    with wds.TarWriter(str(src)) as w:
        for s in data:
            w.write(s)
    convert(src, tmp_path / "rec", format="recordio", workers=1)
    convert(tmp_path / "rec.stoker.json", tmp_path / "back", format="wds", workers=1)
    with open_reader(tmp_path / "back.stoker.json") as r:
        f = r.reader(None, ("txt",))
        got = [f(i) for i in range(len(r))]
        assert [bytes(g[0]) for g in got] == [image_of(s) for s in data]
        assert [g[1] for g in got] == [s["cls"] for s in data]
        assert [g[3]["txt"] for g in got] == [s["txt"] for s in data]
    assert verify(tmp_path / "back.stoker.json").ok
