"""TFRecord's image-only read: the image span the index scan caches gives the very bytes a full
parse of the Example gives, for records of the ``tfrecord`` package and of stoker; it is
taken only when the record's CRCs and the bytes around the span still agree (a damaged record
is still an error naming the file, the record and the offset; a wrong cache entry falls back
to the full parse); an index cache of the previous version is rebuilt."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
import simplejpeg

import stoker.formats.tfrecord.index as index
import stoker.formats.tfrecord.shard as reader_mod
from stoker._core.errors import CorruptRecordError
from stoker._core.schema import Field, Schema
from stoker.formats.tfrecord import TFRecordReader, open_writer
from stoker.formats.tfrecord.index import NO_SPAN

tfr_writer = pytest.importorskip("tfrecord.writer")
tfr_reader = pytest.importorskip("tfrecord.reader")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


def jpeg(i: int, h: int = 12, w: int = 16) -> bytes:
    rng = np.random.default_rng(i)
    return simplejpeg.encode_jpeg(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), quality=95)


def blob(i: int, n: int) -> bytes:
    """``n`` bytes that start like a JPEG (the image field holds bytes; nothing decodes here)."""
    return b"\xff\xd8\xff" + np.random.default_rng(i).bytes(n - 3)


def write_with_package(path, records) -> None:
    w = tfr_writer.TFRecordWriter(os.fspath(path))
    try:
        for r in records:
            w.write(r)
    finally:
        w.close()


def package_records(detection: bool) -> list[dict]:
    """Images whose length varints take 1, 2 and 3 bytes (bytes that only start like a JPEG)
    or, with ``detection``, real JPEGs with box lists (record 0 has objects: it decides the
    schema; some records have none); features before and after the image, labels past one
    varint byte."""
    sizes = [40, 127, 128, 1000, 16383, 16384, 70000]
    out = []
    for i in range(14):
        image = jpeg(i, 8 + i, 12) if detection else blob(i, sizes[i % len(sizes)])
        rec = {
            "image/height": (8 + i, "int"),
            "image/format": (b"jpeg", "byte"),
            "image/encoded": (image, "byte"),
            "image/class/label": (300 * i, "int"),
            "image/width": (12, "int"),
        }
        k = (i + 1) % 3 if detection else 0
        if k:
            for side, v in (("xmin", 0.25), ("ymin", 0.25), ("xmax", 0.75), ("ymax", 0.75)):
                rec["image/object/bbox/" + side] = ([v] * k, "float")
            rec["image/object/class/label"] = (list(range(k)), "int")
        out.append(rec)
    return out


def full_parse_reads(r: TFRecordReader) -> list[bytes]:
    """Every image through the full parse: the span table says no span is known."""
    starts = r.shard(0)._span_lists()[1]
    saved = list(starts)
    starts[:] = [NO_SPAN] * len(starts)
    try:
        f = r.reader()
        return [bytes(f(i)[0]) for i in range(len(r))]
    finally:
        starts[:] = saved


def fast_reads(r: TFRecordReader, monkeypatch, indices=None) -> list[tuple[bytes, object]]:
    """Every image and label with the Example parse made impossible: the span path only."""

    def no_parse(*a, **k):
        raise AssertionError("the Example was parsed on the image-only path")

    with monkeypatch.context() as m:
        m.setattr(reader_mod, "parse_features", no_parse)
        f = r.reader(indices)
        return [(bytes(img), label) for img, label, _k, _f in map(f, range(len(r)))]


@pytest.mark.parametrize("detection", [False, True], ids=["varint-sizes", "detection"])
def test_the_span_path_gives_the_full_parses_bytes_for_package_records(
    tmp_path, monkeypatch, detection
):
    records = package_records(detection)
    path = tmp_path / "theirs.tfrecord"
    write_with_package(path, records)
    theirs = list(tfr_reader.tfrecord_loader(str(path), None))
    for order in (None, np.random.default_rng(0).permutation(len(records))):
        with TFRecordReader(path) as r:
            assert ("boxes" in r.schema.stored) == detection
            fast = fast_reads(r, monkeypatch, order)
            full = full_parse_reads(r)
            assert [img for img, _ in fast] == full
            assert [lab for _, lab in fast] == [300 * i for i in range(len(records))]
            for i, t in enumerate(theirs):
                assert full[i] == bytes(t["image/encoded"]) == records[i]["image/encoded"][0]
            if detection:  # fields still come from the parse, the image with them the same
                with_fields = r.reader(None, ("boxes", "classes"))
                assert [bytes(with_fields(i)[0]) for i in range(len(r))] == full


def test_the_span_path_gives_the_full_parses_bytes_for_stoker_records(tmp_path, monkeypatch):
    schema = Schema(
        {
            "image": Field.image(),
            "label": Field.numeric((), "int64", header=True),
            "caption": Field.text(),
        }
    )
    w = open_writer(tmp_path / "ours", None, schema=schema)
    images = [jpeg(i, 8 + i, 10) for i in range(9)]
    for i, im in enumerate(images):
        w.write(100 + i, im, i % 4, {"caption": f"record {i}" * i})
    path = w.commit()["files"]["data"]
    with TFRecordReader(path) as r:
        fast = fast_reads(r, monkeypatch)
        assert [img for img, _ in fast] == full_parse_reads(r) == images
        assert r.keys().tolist() == list(range(100, 109))


def test_a_flipped_bit_in_the_image_is_still_a_crc_error(tmp_path, monkeypatch):
    images = [jpeg(i) for i in range(3)]
    w = open_writer(tmp_path / "d", None, schema=Schema.classification())
    offsets = []
    for i, im in enumerate(images):
        offsets.append(w.bytes_written)
        w.write(i, im, i)
    path = w.commit()["files"]["data"]
    with TFRecordReader(path) as r:
        r.labels()  # indexed and cached before the damage
    with open(path, "rb") as fh:
        raw = bytearray(fh.read())
    at = raw.index(images[1]) + len(images[1]) // 2  # inside record 1's image bytes
    raw[at] ^= 0x10
    with open(path, "r+b") as fh:
        fh.write(raw)  # same size, in place: the cached index still applies
    os.utime(path, ns=(os.stat(path).st_atime_ns, os.stat(path).st_mtime_ns))
    with TFRecordReader(path) as r:
        f = r.reader()
        assert bytes(f(0)[0]) == images[0] and bytes(f(2)[0]) == images[2]
        with pytest.raises(CorruptRecordError, match="record 1: data CRC mismatch") as info:
            f(1)
        assert info.value.offset == offsets[1] and path in str(info.value)
    with TFRecordReader(path, checksums=False) as r:  # CRC off: the damaged bytes, as before
        assert bytes(r.reader()(1)[0]) == bytes(raw[at - len(images[1]) // 2 :][: len(images[1])])


def _meta_entry(tmp_path) -> str:
    (entry,) = (tmp_path / "cache" / "tfrecord-meta").iterdir()
    return os.fspath(entry)


def test_a_wrong_cached_span_falls_back_to_the_full_parse(tmp_path):
    images = [jpeg(i) for i in range(4)]
    path = tmp_path / "p.tfrecord"
    write_with_package(
        path,
        [
            {"image/encoded": (im, "byte"), "image/class/label": (i, "int")}
            for i, im in enumerate(images)
        ],
    )
    with TFRecordReader(path) as r:
        assert [bytes(r.reader()(i)[0]) for i in range(4)] == images
    entry = _meta_entry(tmp_path)
    with open(entry, "rb") as fh:
        raw = bytearray(fh.read())
    spans = np.frombuffer(raw, "<u4", count=8, offset=len(raw) - 32).reshape(4, 2).copy()
    assert (spans[:, 1] == [len(im) for im in images]).all()
    spans[0, 0] += 1  # shifted: no longer preceded by its length
    spans[1, 1] -= 1  # shortened: the varint before it says otherwise
    spans[2, 0] = 1 << 30  # past the record
    spans[3, 0] = NO_SPAN  # unknown
    raw[-32:] = spans.astype("<u4").tobytes()
    with open(entry, "wb") as fh:
        fh.write(raw)
    for checksums in (True, False):
        with TFRecordReader(path, checksums=checksums) as r:
            assert int(r.shard(0)._span_lists()[1][0]) == spans[0, 0]  # the edited entry was loaded
            assert [bytes(r.reader()(i)[0]) for i in range(4)] == images


def test_an_index_cache_of_version_1_is_rebuilt(tmp_path, monkeypatch):
    path = tmp_path / "v.tfrecord"
    write_with_package(path, [{"image/encoded": (jpeg(i), "byte")} for i in range(3)])
    with TFRecordReader(path):
        pass
    entries = [
        os.fspath(p)
        for d in ("tfrecord-index", "tfrecord-meta")
        for p in (tmp_path / "cache" / d).iterdir()
    ]
    for e in entries:  # as the previous version wrote them (the meta had no spans then)
        with open(e, "rb") as fh:
            raw = bytearray(fh.read())
        raw[8:12] = struct.pack("<I", 1)
        if "tfrecord-meta" in e:
            raw = raw[:-24]
        with open(e, "wb") as fh:
            fh.write(raw)
    scans = []
    real_offsets, real_meta = index.scan_offsets, index._scan_meta
    monkeypatch.setattr(index, "scan_offsets", lambda *a: scans.append("o") or real_offsets(*a))
    monkeypatch.setattr(index, "_scan_meta", lambda *a: scans.append("m") or real_meta(*a))
    with TFRecordReader(path) as r:
        assert bytes(r.reader()(2)[0]) == jpeg(2)
    assert scans == ["o", "m"]
    for e in entries:
        with open(e, "rb") as fh:
            assert struct.unpack_from("<I", fh.read(), 8)[0] == 2
