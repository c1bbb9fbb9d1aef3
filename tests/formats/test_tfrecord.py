"""TFRecord: golden bytes from the spec, files of the ``tfrecord`` package read by stoker and
stoker's read by it (images and labels byte-identical both ways), detection fields, manifest
sets, the index cache, resume, and the registry."""

from __future__ import annotations

import os
import pickle
import struct

import crc32c
import numpy as np
import pytest
import simplejpeg

import stoker.formats
from stoker._core.errors import CorruptRecordError, ManifestError
from stoker._core.schema import Field, Schema
from stoker.formats.tfrecord import (
    TFRecordReader,
    mask_crc,
    masked_crc,
    open_writer,
    write_set_manifest,
)

tfr_writer = pytest.importorskip("tfrecord.writer")
tfr_reader = pytest.importorskip("tfrecord.reader")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    """Every test gets its own cache directory (never the user's)."""
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


def jpeg(i: int, h: int = 20, w: int = 30) -> bytes:
    rng = np.random.default_rng(i)
    return simplejpeg.encode_jpeg(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), quality=90)


def write_with_package(path, records) -> None:
    """Write ``records`` (dicts of feature -> (value, "byte"|"int"|"float")) with the
    ``tfrecord`` package's own writer."""
    w = tfr_writer.TFRecordWriter(os.fspath(path))
    try:
        for r in records:
            w.write(r)
    finally:
        w.close()


# --------------------------------------------------------------------------- golden bytes
def test_masked_crc_matches_the_spec_formula():
    # CRC32C("123456789") = 0xE3069283, the published check value of Castagnoli's CRC
    crc = 0xE3069283
    assert crc32c.crc32c(b"123456789") == crc
    rotated = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
    want = (rotated + 0xA282EAD8) % 2**32
    assert mask_crc(crc) == want == masked_crc(b"123456789")
    assert masked_crc(b"") == 0xA282EAD8  # CRC 0 rotates to 0: only the delta is left
    # the package's own (independent) masking agrees
    assert tfr_writer.TFRecordWriter.masked_crc(b"123456789") == struct.pack("<I", want)


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def _hand_example(image: bytes, label: int) -> bytes:
    """tf.train.Example bytes built field by field from example.proto / feature.proto."""

    def entry(name: bytes, feature: bytes) -> bytes:
        body = b"\x0a" + _varint(len(name)) + name + b"\x12" + _varint(len(feature)) + feature
        return b"\x0a" + _varint(len(body)) + body  # Features.feature (map entry), field 1

    bytes_list = b"\x0a" + _varint(len(image)) + image  # BytesList.value, field 1
    image_feat = b"\x0a" + _varint(len(bytes_list)) + bytes_list  # Feature.bytes_list = 1
    packed = _varint(label)
    int_list = b"\x0a" + _varint(len(packed)) + packed  # Int64List.value, packed
    label_feat = b"\x1a" + _varint(len(int_list)) + int_list  # Feature.int64_list = 3
    features = entry(b"image/encoded", image_feat) + entry(b"image/class/label", label_feat)
    return b"\x0a" + _varint(len(features)) + features  # Example.features, field 1


def test_a_one_record_file_assembled_byte_by_byte(tmp_path):
    image = jpeg(1)
    data = _hand_example(image, 300)  # 300: a two-byte varint
    length = struct.pack("<Q", len(data))
    rec = (
        length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I", masked_crc(data))
    )
    path = tmp_path / "one.tfrecord"
    path.write_bytes(rec)
    with TFRecordReader(path) as r:
        assert len(r) == 1 and r.keys().tolist() == [0]
        img, label, key, fields = r.reader()(0)
        assert bytes(img) == image and label == 300 and key == 0 and fields == {}
        assert r.labels().dtype == np.int64 and r.schema.header_name == "label"
    # and the independent reader agrees with the hand-made bytes
    (got,) = list(tfr_reader.tfrecord_loader(str(path), None))
    assert bytes(got["image/encoded"]) == image and got["image/class/label"].tolist() == [300]


# --------------------------------------------------------------------------- both directions
def test_files_of_the_tfrecord_package_read_by_stoker(tmp_path):
    images = [jpeg(i, 16 + i, 24) for i in range(7)]
    path = tmp_path / "theirs.tfrecord"
    write_with_package(
        path,
        [
            {
                "image/encoded": (im, "byte"),
                "image/class/label": (i % 3, "int"),
                "image/format": (b"jpeg", "byte"),
                "image/height": (16 + i, "int"),
                "image/width": (24, "int"),
            }
            for i, im in enumerate(images)
        ],
    )
    r = stoker.formats.open(path)
    try:
        assert isinstance(r, TFRecordReader) and r.format == "tfrecord"
        assert len(r) == 7
        assert r.labels().tolist() == [i % 3 for i in range(7)]
        f = r.reader(np.arange(7))
        for i in (6, 0, 3):  # any order
            img, label, key, _ = f(i)
            assert bytes(img) == images[i] and label == i % 3 and key == i
        assert r.locate(2)[0] == str(path) and r.files() == [str(path)]
        facts = r.summary()  # what `stoker inspect` shows
        per = facts["bytes_per_record"]
        assert per["min"] >= 16 + len(images[0]) and per["max"] <= path.stat().st_size
        assert facts["label_feature"] == "image/class/label" and facts["keys"] == "record positions"
    finally:
        r.close()


def test_files_written_by_stoker_read_by_the_tfrecord_package(tmp_path):
    images = [jpeg(i, 10 + i, 12) for i in range(6)]
    w = open_writer(tmp_path / "ours", None, schema=Schema.classification())
    for i, im in enumerate(images):
        w.write(100 + i, im, i % 4)
    entry = w.commit()
    assert entry["records"] == 6 and entry["bytes"] == os.path.getsize(entry["files"]["data"])
    assert entry["files"]["data"].endswith("ours.tfrecord")
    got = list(tfr_reader.tfrecord_loader(entry["files"]["data"], None))
    assert len(got) == 6
    for i, ex in enumerate(got):
        assert bytes(ex["image/encoded"]) == images[i]
        assert ex["image/class/label"].tolist() == [i % 4]
        assert ex["image/height"].tolist() == [10 + i] and ex["image/width"].tolist() == [12]
        assert bytes(ex["image/format"]) == b"jpeg" and ex["stoker/key"].tolist() == [100 + i]
    with TFRecordReader(entry["files"]["data"]) as r:  # the bare file, without a manifest
        assert r.keys().tolist() == list(range(100, 106))
        assert [bytes(r.reader()(i)[0]) for i in range(6)] == images


# --------------------------------------------------------------------------- detection
def _detection_records(n: int):
    out, images = [], []
    for i in range(n):
        h, w = 20 + 4 * i, 40
        im = jpeg(i, h, w)
        images.append((im, h, w))
        k = i % 4  # 0..3 objects; record 0 has none
        xmin = [0.125 * j for j in range(k)]
        out.append(
            {
                "image/encoded": (im, "byte"),
                "image/class/label": (i, "int"),
                "image/object/bbox/xmin": (xmin, "float"),
                "image/object/bbox/ymin": ([0.25] * k, "float"),
                "image/object/bbox/xmax": ([x + 0.5 for x in xmin], "float"),
                "image/object/bbox/ymax": ([0.75] * k, "float"),
                "image/object/class/label": ([7 + j for j in range(k)], "int"),
            }
        )
    return out, images


def test_detection_records_of_the_package_arrive_as_boxes_and_classes(tmp_path):
    records, images = _detection_records(6)
    path = tmp_path / "det.tfrecord"
    write_with_package(path, records)
    with TFRecordReader(path) as r:
        s = r.schema
        assert s["boxes"].geometry == "boxes" and s["boxes"].max_len == 3
        assert s["classes"].follows == "boxes" and s["classes"].dtype == "int64"
        assert s["classes"].max_len == 3
        f = r.reader(None, ("boxes", "classes"))
        for i in range(6):
            img, label, _key, fields = f(i)
            im, h, w = images[i]
            assert bytes(img) == im and label == i
            k = i % 4
            want = np.array(
                [[0.125 * j * w, 0.25 * h, (0.125 * j + 0.5) * w, 0.75 * h] for j in range(k)]
            ).reshape(k, 4)
            np.testing.assert_array_equal(fields["boxes"], want)  # dyadic: exact
            assert fields["classes"].tolist() == [7 + j for j in range(k)]
        # only what is asked for
        assert r.reader(None, ("boxes",))(1)[3].keys() == {"boxes"}


def test_boxes_read_and_written_again_keep_their_exact_fractions(tmp_path):
    records, images = _detection_records(5)
    for r in records:  # fractions that are not dyadic: float32 rounding shows if any
        r["image/object/bbox/ymin"] = ([0.1] * len(r["image/object/bbox/xmin"][0]), "float")
    src = tmp_path / "src.tfrecord"
    write_with_package(src, records)
    with TFRecordReader(src) as r:
        w = open_writer(tmp_path / "again", None, schema=r.schema)
        f = r.reader(None, ("boxes", "classes"))
        for i in range(len(r)):
            img, label, key, fields = f(i)
            w.write(key, img, label, fields)
        entry = w.commit()
    theirs = list(tfr_reader.tfrecord_loader(str(src), None))
    ours = list(tfr_reader.tfrecord_loader(entry["files"]["data"], None))
    for a, b in zip(theirs, ours, strict=True):
        for s in ("xmin", "ymin", "xmax", "ymax"):
            name = "image/object/bbox/" + s
            assert a[name].tobytes() == b[name].tobytes()
        assert bytes(a["image/encoded"]) == bytes(b["image/encoded"])


def test_fields_round_trip_through_a_stoker_manifest_set(tmp_path):
    schema = Schema(
        {
            "image": Field.image(),
            "label": Field.numeric((), "int64", header=True),
            "boxes": Field.boxes(),
            "classes": Field.ragged((), "int64", follows="boxes"),
            "caption": Field.text(),
            "score": Field.numeric((2,), "float32"),
        }
    )
    shards, images = [], []
    for s in range(3):
        w = open_writer(tmp_path / "set", s, schema=schema)
        for j in range(4):
            i = 4 * s + j
            im = jpeg(i, 32, 64)
            images.append(im)
            boxes = [[8.0 * k, 4.0, 8.0 * k + 16, 20.0] for k in range(j)]
            fields = {
                "boxes": boxes,
                "classes": list(range(j)),
                "caption": f"image n\u00b0{i}",
                "score": [i / 2, 0.25],
            }
            w.write(1000 + i, im, i % 5, fields)
        shards.append(w.commit())
    man = tmp_path / "set.stoker.json"
    write_set_manifest(man, shards, classes=["a", "b", "c", "d", "e"], schema=schema)
    r = stoker.formats.open(man)
    try:
        assert len(r) == 12 and r.class_names == ["a", "b", "c", "d", "e"]
        assert r.keys().tolist() == list(range(1000, 1012))
        assert r.schema["caption"].max_len == len("image n\u00b011".encode())
        assert r.schema["boxes"].max_len == 3
        f = r.reader(None, ("boxes", "classes", "caption", "score"))
        for i in range(12):
            img, label, key, fields = f(i)
            j = i % 4
            assert bytes(img) == images[i] and label == i % 5 and key == 1000 + i
            want = np.array([[8.0 * k, 4.0, 8.0 * k + 16, 20.0] for k in range(j)]).reshape(j, 4)
            np.testing.assert_allclose(fields["boxes"], want, rtol=1e-6)
            assert fields["classes"].tolist() == list(range(j))
            assert fields["caption"] == f"image n\u00b0{i}"
            assert fields["score"].tolist() == [i / 2, 0.25]
        # pickles as its configuration and reopens where it is used
        r2 = pickle.loads(pickle.dumps(r))
        try:
            assert bytes(r2.reader()(5)[0]) == images[5] and r2.fingerprint() == r.fingerprint()
        finally:
            r2.close()
    finally:
        r.close()


def test_manifest_counts_are_checked(tmp_path):
    w = open_writer(tmp_path / "m", 0, schema=Schema.classification())
    w.write(0, jpeg(0), 1)
    entry = w.commit()
    man = tmp_path / "m.stoker.json"
    write_set_manifest(man, [{**entry, "records": 2}], schema=Schema.classification())
    with pytest.raises(Exception, match="1 records, the manifest says 2"):
        TFRecordReader(man)
    with pytest.raises(ManifestError, match="inside"):
        write_set_manifest(man, [{**entry, "files": {"data": "/elsewhere/x.tfrecord"}}])


# --------------------------------------------------------------------------- index cache
def test_index_cache_is_used_and_rebuilt_when_the_file_changes(tmp_path, monkeypatch):
    path = tmp_path / "c.tfrecord"
    write_with_package(path, [{"image/encoded": (jpeg(i), "byte")} for i in range(3)])
    with TFRecordReader(path) as r:
        assert len(r) == 3 and r.labels().tolist() == [-1, -1, -1]  # no label feature
    entries = sorted((tmp_path / "cache" / "tfrecord-index").iterdir())
    assert len(entries) == 1
    raw = entries[0].read_bytes()
    magic, version, _reserved, count, size = struct.unpack_from("<8sIIQQ", raw)
    assert (magic, version, count, size) == (b"STKTFI\x00\x01", 2, 3, path.stat().st_size)
    assert np.frombuffer(raw, "<u8", offset=32)[0] == 0
    import stoker.formats.tfrecord.index as index

    def no_scan(*a, **k):
        raise AssertionError("scanned although the cache holds the index")

    monkeypatch.setattr(index, "scan_offsets", no_scan)
    monkeypatch.setattr(index, "_scan_meta", no_scan)
    with TFRecordReader(path) as r:
        assert len(r) == 3
    monkeypatch.undo()
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    with open(path, "ab") as f:  # the file changes: a new cache entry, 4 records
        w = tfr_writer.TFRecordWriter.__new__(tfr_writer.TFRecordWriter)
        w.file = f
        w.write({"image/encoded": (jpeg(9), "byte")})
    with TFRecordReader(path) as r:
        assert len(r) == 4


def test_reads_without_a_cache_directory(tmp_path, monkeypatch):
    path = tmp_path / "n.tfrecord"
    write_with_package(path, [{"image/encoded": (jpeg(0), "byte")}])
    blocker = tmp_path / "file-not-dir"
    blocker.write_bytes(b"")
    monkeypatch.setenv("STOKER_CACHE_DIR", str(blocker / "cache"))
    with TFRecordReader(path) as r:
        assert bytes(r.reader()(0)[0]) == jpeg(0)


# --------------------------------------------------------------------------- writer
def test_abort_leaves_nothing_and_writer_refuses_what_it_cannot_store(tmp_path):
    w = open_writer(tmp_path / "a", None, schema=Schema.classification())
    w.write(0, jpeg(0), 0)
    with pytest.raises(ValueError, match="key 0 was already written"):
        w.write(0, jpeg(0), 0)
    w.abort()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="points"):
        open_writer(
            tmp_path / "p",
            None,
            schema=Schema({"image": Field.image(), "kp": Field.points()}),
        )
    f64 = Schema({"image": Field.image(), "x": Field.numeric((), "float64")})
    w = open_writer(tmp_path / "f", None, schema=f64)
    w.write(0, jpeg(0), None, {"x": 0.5})  # float32 holds it: stored
    with pytest.raises(ValueError, match="float32 cannot hold exactly"):
        w.write(1, jpeg(1), None, {"x": 0.1})
    w.abort()


# --------------------------------------------------------------------------- options, gzip
def test_feature_names_are_configurable(tmp_path):
    path = tmp_path / "o.tfrecord"
    write_with_package(
        path,
        [
            {
                "jpg": (jpeg(i), "byte"),
                "cls": (float(i) / 2, "float"),
                "caption": (f"cap {i}".encode(), "byte"),
                "ids": ([i] * i, "int"),
            }
            for i in range(3)
        ],
    )
    with TFRecordReader(
        path,
        image_key="jpg",
        label_key="cls",
        features={"caption": ("caption", Field.text()), "ids": "ids"},
    ) as r:
        assert r.labels().dtype == np.float32 and r.labels().tolist() == [0.0, 0.5, 1.0]
        assert r.schema["caption"].kind == "text" and r.schema["ids"].max_len == 2
        _img, _lab, _key, fields = r.reader(None, ("caption", "ids"))(2)
        assert fields["caption"] == "cap 2" and fields["ids"].tolist() == [2, 2]
    with pytest.raises(CorruptRecordError, match="no feature 'image/encoded'"):
        TFRecordReader(path)


def test_gzip_is_refused_with_how_to_decompress(tmp_path):
    import gzip

    plain = tmp_path / "g.tfrecord"
    write_with_package(plain, [{"image/encoded": (jpeg(0), "byte")}])
    for name in ("g.tfrecord.gz", "g-no-suffix.tfrecord"):
        gz = tmp_path / name
        gz.write_bytes(gzip.compress(plain.read_bytes()))
        with pytest.raises(CorruptRecordError, match="gunzip -k") as ei:
            TFRecordReader(gz)
        assert ei.value.path == str(gz) and ei.value.offset == 0
        report = stoker.formats.tfrecord.verify(gz)
        assert not report.ok and "GZIP" in report.problems[0].reason


# --------------------------------------------------------------------------- the loader
def test_the_loader_reads_a_detection_set_with_its_boxes(tmp_path):
    """Through the registry and the loader's generic source: the same batches with 0 and 2
    workers, boxes moved by the resize with the image."""
    import stoker
    from stoker.transforms import Resize

    records, images = _detection_records(6)
    path = tmp_path / "det.tfrecord"
    write_with_package(path, records)
    got = {}
    for workers in (0, 2):
        with stoker.Loader(
            str(path), batch_size=3, transforms=Resize((32, 32)), workers=workers, seed=0
        ) as loader:
            got[workers] = [
                (b.images.copy(), b.labels.copy(), b.keys.copy(), b["boxes"]) for b in loader
            ]
    assert len(got[0]) == 2
    for a, b in zip(got[0], got[2], strict=True):
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1].tolist() == b[1].tolist() and a[2].tolist() == b[2].tolist()
        for x, y in zip(a[3], b[3], strict=True):
            np.testing.assert_allclose(x, y)
    _im, h, w = images[2]
    boxes = got[0][0][3][2]  # sample 2: two objects, the image resized to 32 x 32
    want = np.array(
        [[0.125 * j * 32, 0.25 * 32, (0.125 * j + 0.5) * 32, 0.75 * 32] for j in range(2)]
    )
    np.testing.assert_allclose(boxes, want, atol=1e-4)


def test_many_shards_keep_few_files_mapped(tmp_path, monkeypatch):
    import stoker.formats.sharded as reader_mod

    monkeypatch.setattr(reader_mod, "MAX_OPEN_SHARDS", 2)
    shards, images = [], []
    for s in range(5):
        w = open_writer(tmp_path / "many", s, schema=Schema.classification())
        for j in range(3):
            images.append(jpeg(10 * s + j))
            w.write(10 * s + j, images[-1], s)
        shards.append(w.commit())
    man = tmp_path / "many.stoker.json"
    write_set_manifest(man, shards, schema=Schema.classification())
    with TFRecordReader(man) as r:
        assert r.labels().tolist() == [s for s in range(5) for _ in range(3)]
        f = r.reader()
        order = np.random.default_rng(0).permutation(15).tolist() * 2
        for i in order:
            img = f(i)[0]
            assert bytes(img) == images[i]
            del img  # a held view keeps its file mapped (and is still valid)
            assert sum(s is not None and s.mm is not None for s in r._shards) <= 2
        assert r.files() == [sh["files"]["data"] for sh in shards]
