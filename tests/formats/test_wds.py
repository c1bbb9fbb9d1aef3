"""WebDataset tar shards: golden headers built from the spec, both directions with the
``webdataset`` package, grouping, schema and captions, the index cache, sets of shards."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from _wds_util import (
    end_of_archive,
    hand_header,
    hand_member,
    image_of,
    jpeg,
    png,
    samples,
)

import stoker.formats
from stoker._core.errors import CorruptRecordError, ManifestError
from stoker._core.schema import Field, Schema
from stoker.formats.wds import (
    WdsReader,
    checksum,
    open_reader,
    open_writer,
    ustar_header,
    verify,
    write_set_manifest,
)
from stoker.formats.wds import index as wds_index


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


def read_with_webdataset(tar: str) -> list[dict]:
    """The samples of ``tar`` through webdataset's own reading pipeline (the expander and
    grouping ``wds.WebDataset`` runs), on a file this test closes."""
    with open(tar, "rb") as f:
        stream = wds.tariterators.tar_file_expander([{"url": tar, "stream": f}])
        return list(wds.tariterators.group_by_keys(stream))


def read_all(r: WdsReader, fields: tuple[str, ...] = ()) -> list[tuple[bytes, int, int, dict]]:
    f = r.reader(None, fields)
    out = []
    for i in range(len(r)):
        img, label, key, fl = f(i)
        out.append((bytes(img), label, key, fl))
    return out


# ---------------------------------------------------------------------- golden bytes
def test_hand_built_header_read_by_stoker(tmp_path):
    img = jpeg(1)
    tar = (
        hand_member(b"k001.jpg", img)
        + hand_member(b"k001.cls", b"7\n")
        + hand_member(b"k001.txt", "h\u00e9llo".encode())
        + hand_member(b"k002.jpg", jpeg(2))
        + hand_member(b"k002.cls", b" 3 ")
        + end_of_archive()
    )
    p = tmp_path / "hand.tar"
    p.write_bytes(tar)
    with open_reader(p) as r:
        assert len(r) == 2
        rows = read_all(r, ("txt",))
        assert rows[0] == (img, 7, 0, {"txt": "h\u00e9llo"})
        assert rows[1] == (jpeg(2), 3, 1, {"txt": ""})
        assert r.key_name(0) == "k001"
        assert r.labels().tolist() == [7, 3]
        assert r.labels().dtype == np.int64
    # Python's tarfile agrees that the hand-built bytes are a valid archive
    with tarfile.open(p) as t:
        assert t.getnames() == ["k001.jpg", "k001.cls", "k001.txt", "k002.jpg", "k002.cls"]
    assert verify(p).ok


def test_writer_header_equals_the_spec_layout():
    h = ustar_header(b"000000042.jpg", 1234)
    assert h == hand_header(b"000000042.jpg", 1234, mode=0o444)
    assert h[148:156] == f"{sum(h[:148]) + 256 + sum(h[156:]):06o}".encode() + b"\x00 "
    unsigned, _ = checksum(h)
    assert int(h[148:154], 8) == unsigned
    ti = tarfile.TarInfo.frombuf(h, "utf-8", "surrogateescape")
    assert (ti.name, ti.size, ti.mode, ti.mtime, ti.uid, ti.gid) == (
        "000000042.jpg",
        1234,
        0o444,
        0,
        0,
        0,
    )


# ---------------------------------------------------------------------- webdataset, both ways
def test_webdataset_tarwriter_read_by_stoker(tmp_path):
    data = samples(12)
    p = tmp_path / "w.tar"
    with wds.TarWriter(str(p)) as w:
        for s in data:
            w.write(s)
    with open_reader(p) as r:
        assert len(r) == len(data)
        assert list(r.schema) == ["image", "label", "txt"]
        assert r.schema["txt"].max_len == max(len(s["txt"].encode()) for s in data)
        rows = read_all(r, ("txt",))
        for s, (img, label, _key, fl) in zip(data, rows, strict=True):
            assert img == image_of(s)
            assert label == s["cls"]
            assert fl == {"txt": s["txt"]}
        assert [r.key_name(i) for i in range(len(r))] == [s["__key__"] for s in data]
        np.testing.assert_array_equal(r.keys(), np.arange(len(data)))
    assert verify(p).ok


def test_webdataset_shardwriter_set_read_by_stoker(tmp_path):
    data = samples(10)
    pattern = str(tmp_path / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=4, verbose=0) as w:
        for s in data:
            w.write(s)
    tars = sorted(tmp_path.glob("shard-*.tar"))
    assert len(tars) == 3
    got = []
    for t in tars:
        with open_reader(t) as r:
            got += read_all(r, ("txt",))
    assert [g[0] for g in got] == [image_of(s) for s in data]
    assert [g[1] for g in got] == [s["cls"] for s in data]
    assert [g[3]["txt"] for g in got] == [s["txt"] for s in data]


def _write_stoker(prefix, n: int, *, schema: Schema | None = None, shard=None, fields=None):
    w = open_writer(prefix, shard, schema=schema)
    for i in range(n):
        img = jpeg(i) if i % 2 else png(i)
        w.write(100 + i, img, i % 5, fields(i) if fields else None)
    entry = w.commit()
    return {**entry, "path": os.path.join(os.path.dirname(prefix), entry["files"]["data"])}


def test_stoker_shards_read_by_webdataset(tmp_path):
    schema = Schema(
        {
            "image": Field.image(),
            "label": Field.numeric((), "int64", header=True),
            "txt": Field.text(),
        }
    )
    entry = _write_stoker(
        tmp_path / "s", 9, schema=schema, fields=lambda i: {"txt": f"caption {i} \u00fc"}
    )
    got = read_with_webdataset(entry["path"])
    assert [g["__key__"] for g in got] == [f"{100 + i:09d}" for i in range(9)]
    for i, g in enumerate(got):
        img = jpeg(i) if i % 2 else png(i)
        assert g["jpg" if i % 2 else "png"] == img
        assert int(g["cls"]) == i % 5
        assert g["txt"].decode() == f"caption {i} \u00fc"
    # and tarfile sees stoker's fixed metadata
    with tarfile.open(entry["path"]) as t:
        for m in t.getmembers():
            assert (m.mode, m.mtime, m.uid, m.gid, m.uname, m.gname) == (0o444, 0, 0, 0, "", "")
            assert m.isreg()


def test_writer_is_deterministic_and_hashes_what_it_wrote(tmp_path):
    a = _write_stoker(tmp_path / "a", 6)
    b = _write_stoker(tmp_path / "b", 6)
    ba, bb = Path(a["path"]).read_bytes(), Path(b["path"]).read_bytes()
    assert ba == bb
    assert len(ba) % 10240 == 0 and ba.endswith(bytes(1024))
    assert a["checksums"]["data.sha256"] == hashlib.sha256(ba).hexdigest()
    assert a["bytes"] == len(ba) and a["records"] == 6


def test_fields_round_trip_through_a_manifest(tmp_path):
    schema = Schema(
        {
            "image": Field.image(),
            "label": Field.numeric((), "int64", header=True),
            "caption": Field.text(),
            "boxes": Field.boxes(),
            "classes": Field.ragged((), "int64", follows="boxes"),
            "score": Field.numeric((2,), "float32"),
            "blob": Field.bytes_(),
        }
    )

    def fields(i):
        boxes = np.arange(4 * i, dtype=np.float32).reshape(i, 4) / 3
        return {
            "caption": "x" * i,
            "boxes": boxes,
            "classes": np.arange(i),
            "score": np.array([i / 7, -1.5], np.float32),
            "blob": bytes(range(i)),
        }

    entries = [
        _write_stoker(tmp_path / "set", 4, schema=schema, shard=k, fields=fields) for k in (0, 1)
    ]
    m = tmp_path / "set.stoker.json"
    write_set_manifest(m, entries, classes={"a": 0, "b": 1}, schema=schema)
    r = stoker.formats.open(m)
    assert isinstance(r, WdsReader)
    assert r.schema["boxes"].max_len == 3 and r.schema["caption"].max_len == 3
    assert r.class_names == ["a", "b"]
    f = r.reader(None, ("caption", "boxes", "classes", "score", "blob"))
    for i in range(8):
        img, label, key, got = f(i)
        want = fields(i % 4)
        assert label == (i % 4) % 5
        assert got["caption"] == want["caption"] and got["blob"] == want["blob"]
        for name in ("boxes", "classes", "score"):
            assert got[name].dtype == schema[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
    assert verify(m).ok
    r.close()


# ---------------------------------------------------------------------- grouping and schema
def test_grouping_follows_webdataset_rules(tmp_path):
    tar = (
        hand_member(b"dir/a.b.jpg", jpeg(0))  # key dir/a, suffix b.jpg: not an image suffix
        + hand_member(b"dir/a.png", png(0))
        + hand_member(b"dir/a.CLS", b"1")  # suffixes are lowercased
        + hand_member(b"dir/", b"", typeflag=b"5")  # folders are skipped
        + hand_member(b"README", b"no dot: skipped")
        + hand_member(b"__meta__/info.json", b"{}")  # WebDataset's meta entries are skipped
        + hand_member(b"__index__", b"")
        + hand_member(b"dir/b.webp", b"RIFF\x00\x00\x00\x00WEBPVP8 ")
        + hand_member(b"dir/b.cls", b"2")
        + end_of_archive()
    )
    p = tmp_path / "g.tar"
    p.write_bytes(tar)
    # the member that is not an image is named as left out, once, when the schema is made
    with open_reader(p) as r, pytest.warns(UserWarning, match=r"members \.b\.jpg are not read"):
        assert [r.key_name(i) for i in range(len(r))] == ["dir/a", "dir/b"]
        rows = read_all(r)
        assert rows[0][0] == png(0) and rows[0][1] == 1
        assert rows[1][1] == 2
        assert list(r.schema) == ["image", "label"]
        assert "dir/b" in r.describe(1) and "byte offset" in r.describe(1)


def test_unlabelled_set_has_label_zero_and_json_as_text(tmp_path):
    tar = (
        hand_member(b"x1.jpg", jpeg(1))
        + hand_member(b"x1.json", b'{"w": 8}')
        + hand_member(b"x2.jpg", jpeg(2))
        + end_of_archive()
    )
    p = tmp_path / "u.tar"
    p.write_bytes(tar)
    with open_reader(p) as r:
        assert r.labels().tolist() == [0, 0]
        assert r.schema["json"].kind == "text" and r.schema["json"].max_len == 8
        assert [row[3] for row in read_all(r, ("json",))] == [{"json": '{"w": 8}'}, {"json": ""}]


def test_long_gnu_and_pax_names(tmp_path):
    deep = "d" * 90 + "/" + "e" * 90 + "/"
    for fmt, name in ((tarfile.GNU_FORMAT, deep + "k1"), (tarfile.PAX_FORMAT, "caf\u00e9/k1")):
        p = tmp_path / f"n{fmt}.tar"
        with tarfile.open(p, "w", format=fmt) as t:
            for suffix, data in (("jpg", jpeg(3)), ("cls", b"4")):
                ti = tarfile.TarInfo(f"{name}.{suffix}")
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
        with open_reader(p) as r:
            assert r.key_name(0) == name
            assert read_all(r)[0][:2] == (jpeg(3), 4)


# ---------------------------------------------------------------------- index cache, pickling
def test_index_is_cached_and_rebuilt_when_the_file_changes(tmp_path, monkeypatch):
    entry = _write_stoker(tmp_path / "c", 5)
    tar = entry["path"]
    with open_reader(tar) as r:
        first = read_all(r)
    cached = list((tmp_path / "cache" / "wds-index").iterdir())
    assert len(cached) == 1 and cached[0].suffix == ".stkwds"

    def boom(*a, **k):
        raise AssertionError("the index was rebuilt although a sound cache entry exists")

    with monkeypatch.context() as mp:
        mp.setattr(wds_index, "build_index", boom)
        with open_reader(tar) as r:
            assert read_all(r) == first
    # a damaged cache entry is rebuilt, never trusted
    cached[0].write_bytes(cached[0].read_bytes()[:-9] + b"garbage!!")
    with open_reader(tar) as r:
        assert read_all(r) == first
    # the file changes: a new entry, the new content
    os.unlink(tar)
    _write_stoker(tmp_path / "c", 3)
    with open_reader(tar) as r:
        assert len(r) == 3
    # an unwritable cache directory means no cache, not an error
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "file-not-dir"))
    (tmp_path / "file-not-dir").write_bytes(b"")
    with open_reader(tar) as r:
        assert len(r) == 3


def test_reader_pickles_as_its_path_and_reopens(tmp_path):
    entry = _write_stoker(tmp_path / "p", 4)
    r = open_reader(entry["path"])
    before = read_all(r)
    blob = pickle.dumps(r)
    assert len(blob) < 400
    r2 = pickle.loads(blob)
    assert read_all(r2) == before
    assert r2.fingerprint() == r.fingerprint()
    r.close()
    r2.close()


def test_a_set_of_shards_reads_as_one(tmp_path):
    entries = [_write_stoker(tmp_path / "m", n, shard=k) for k, n in enumerate((3, 1, 4))]
    m = tmp_path / "m.stoker.json"
    write_set_manifest(m, entries)
    with open_reader(m) as r:
        assert len(r) == 8
        assert r.labels().tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
        assert "m-00001.tar" in r.describe(3) and "'000000100'" in r.describe(3)
        rows = read_all(r)
        assert rows[4][0] == png(0) and rows[7][0] == jpeg(3)
        with pytest.raises(IndexError):
            r.reader()(8)
        fp = r.fingerprint()
        assert fp["format"] == "wds" and fp["records"] == 8
    # a shard replaced after the manifest was written is refused by name
    os.unlink(entries[1]["path"])
    _write_stoker(tmp_path / "m", 2, shard=1)  # same size (padded to 10240), one more sample
    with pytest.raises(ManifestError, match=r"m-00001.crc32c .* 8 bytes, not 4 bytes for each"):
        open_reader(m)  # its new side-car holds 2 checksums where the manifest counts 1 sample
    bare = [{**e, "files": {"data": e["files"]["data"]}} for e in entries]  # no side-cars
    write_set_manifest(m, bare)
    with open_reader(m) as r:  # without side-cars, the count is what finds it
        with pytest.raises(ManifestError, match="m-00001.tar has 2 records, the manifest says 1"):
            r.labels()
    os.unlink(entries[1]["path"])
    _write_stoker(tmp_path / "m", 40, shard=1)
    with pytest.raises(ManifestError, match="m-00001.tar is .* bytes but the manifest records"):
        open_reader(m)


def test_compressed_tar_is_refused_clearly(tmp_path):
    entry = _write_stoker(tmp_path / "z", 2)
    gz = tmp_path / "z.tar.gz"
    gz.write_bytes(gzip.compress(Path(entry["path"]).read_bytes()))
    with pytest.raises(CorruptRecordError, match="gzip-compressed.*uncompressed tar"):
        open_reader(gz)
    disguised = tmp_path / "disguised.tar"
    disguised.write_bytes(gz.read_bytes())
    with pytest.raises(CorruptRecordError, match="gzip-compressed"):
        len(open_reader(disguised))
    assert not verify(disguised).ok


# ---------------------------------------------------------------------- through the loader
def test_loader_batches_equal_recordio_for_the_same_samples(tmp_path):
    """The same samples as WebDataset shards and as RecordIO give the same batches (images,
    labels, captions) for one seed, with and without workers."""
    import stoker
    from stoker.formats.registry import get
    from stoker.transforms import Compose, HorizontalFlip, Resize

    data = samples(10)
    schema = Schema(
        {
            "image": Field.image(),
            "label": Field.numeric((), "int64", header=True),
            "txt": Field.text(max_len=max(len(s["txt"].encode()) for s in data)),
        }
    )
    sets = {}
    for fmt in ("wds", "recordio"):
        folder = tmp_path / fmt
        folder.mkdir()
        writer = get(fmt).load("writer")(str(folder / "s"), 0, schema=schema)
        for i, s in enumerate(data):
            writer.write(i, image_of(s), s["cls"], {"txt": s["txt"]})
        entry = writer.commit()
        sets[fmt] = str(folder / "s.stoker.json")
        get(fmt).load("manifest")(sets[fmt], [entry], classes=None, schema=schema)
    chain = Compose([Resize((12, 12)), HorizontalFlip()])
    for workers in (0, 2):
        got = {}
        for fmt, path in sets.items():
            with stoker.Loader(
                path, batch_size=4, transforms=chain, shuffle=True, seed=7, workers=workers
            ) as loader:
                got[fmt] = [
                    (b.images.copy(), b.labels.copy(), b.indices.copy(), b["txt"]) for b in loader
                ]
        assert len(got["wds"]) == 3
        for a, b in zip(got["wds"], got["recordio"], strict=True):
            np.testing.assert_array_equal(a[0], b[0])
            np.testing.assert_array_equal(a[1], b[1])
            np.testing.assert_array_equal(a[2], b[2])
            assert list(a[3]) == list(b[3])
        assert sorted(t for batch in got["wds"] for t in batch[3]) == sorted(s["txt"] for s in data)


def _one_record_shards(stem, n: int):
    """A set of ``n`` shards of one record each (key k, image k % 5, label k % 3); its manifest."""
    entries = []
    for k in range(n):
        w = open_writer(stem, k)
        w.write(k, jpeg(k % 5), k % 3)
        entries.append(w.commit())
    m = stem.parent / (stem.name + ".stoker.json")
    write_set_manifest(m, entries)
    return m


def test_many_shards_stay_within_the_open_map_limit(tmp_path):
    from stoker.formats.wds import MAX_OPEN_SHARDS

    n = MAX_OPEN_SHARDS + 6
    with open_reader(_one_record_shards(tmp_path / "many", n)) as r:
        assert r.labels().tolist() == [k % 3 for k in range(n)]
        assert not any(s._view is not None for s in r._all())  # indexing maps and unmaps
        f = r.reader()
        assert [bytes(f(i)[0]) for i in range(n)] == [jpeg(k % 5) for k in range(n)]
        assert sum(s is not None and s._view is not None for s in r._shards) == MAX_OPEN_SHARDS


def test_a_set_of_many_shards_keeps_few_indexes(tmp_path, monkeypatch):
    """Beyond ``MAX_KEPT_SHARDS`` opened shards, the least recently used is forgotten (its
    index read again when next used): a worker's memory over a set of many shards stays
    bounded, and every read still gives its sample."""
    import stoker.formats.sharded as sharded

    monkeypatch.setattr(sharded, "MAX_KEPT_SHARDS", 3)
    with open_reader(_one_record_shards(tmp_path / "kept", 8)) as r:
        assert r.labels().tolist() == [k % 3 for k in range(8)]
        f = r.reader()
        for i in np.random.default_rng(1).permutation(8).tolist() * 2:
            assert bytes(f(i)[0]) == jpeg(i % 5)
            assert sum(s is not None for s in r._shards) <= 3
