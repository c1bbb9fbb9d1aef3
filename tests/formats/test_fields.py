"""Records with fields: the trailer after the image, read back through ``read_fields`` and
``RecordSource.reader``, cut off by ``read_header``, invisible to MXNet's image read, and
named precisely (file, key, byte offset, field) when damaged."""

from __future__ import annotations

import io
import json
import pickle
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest

from stoker._core.errors import CorruptRecordError, ManifestError, SpecError
from stoker._core.schema import Field, Schema
from stoker.formats.fields import (
    TRAILER_MAGIC,
    TrailerError,
    decode_trailer,
    encode_trailer,
    split_trailer,
)
from stoker.formats.recordio import (
    IR_SIZE,
    IRHeader,
    RecordFile,
    RecordWriter,
    make_manifest,
    pack_header,
    shard_entry,
    write_manifest,
)
from stoker.formats.recordio.seam import RecordIOReader
from stoker.loader.sources.records import RecordSource


def _at(r: RecordIOReader, i: int) -> tuple[RecordFile, int]:
    """The file of sample ``i`` of ``r`` and the record's position in it."""
    j, row = r.where(i)
    sh = r.shard(j)
    return sh._file(), sh._at(row)


SCHEMA = Schema(
    {
        "image": Field.image(),
        "label": Field.numeric((), "int64", header=True),
        "boxes": Field.boxes(),
        "classes": Field.ragged((), "int64", follows="boxes"),
        "keypoints": Field.points((5, 3)),
        "caption": Field.text(),
        "blob": Field.bytes_(),
        "mask": Field.mask(),
        "attrs": Field.numeric((3,), "float32"),
        "year": Field.numeric((), "int16"),
    }
)


def _jpeg(i: int, h: int = 24, w: int = 32) -> bytes:
    rng = np.random.default_rng(i)
    ok, buf = cv2.imencode(".jpg", rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
    assert ok
    return buf.tobytes()


def _png(i: int) -> bytes:
    rng = np.random.default_rng(100 + i)
    ok, buf = cv2.imencode(".png", rng.integers(0, 255, (20, 16, 3), dtype=np.uint8))
    assert ok
    return buf.tobytes()


def _mask_png(i: int, h: int = 24, w: int = 32) -> bytes:
    from PIL import Image

    rng = np.random.default_rng(200 + i)
    im = Image.fromarray(rng.integers(0, 5, (h, w), dtype=np.uint8), mode="P")
    im.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255, 255, 255, 0] + [0] * 753)
    out = io.BytesIO()
    im.save(out, format="PNG")
    return out.getvalue()


def _values(i: int) -> dict:
    rng = np.random.default_rng(i)
    n = i % 4  # 0 rows for every fourth record
    return {
        "boxes": rng.uniform(0, 30, (n, 4)).astype(np.float32),
        "classes": rng.integers(0, 9, n).astype(np.int64),
        "keypoints": rng.uniform(0, 30, (i % 3, 5, 3)).astype(np.float32),
        "caption": "ünïcode ✓ " * (i % 3) + str(i),
        "blob": bytes(range(i % 7)),
        "mask": _mask_png(i),
        "attrs": np.array([i, -i, 0.5], np.float32),
        "year": np.int16(1990 + i),
    }


def _write_set(tmp_path, n: int = 8, *, shards: int = 1, image=_jpeg) -> tuple[str, list[bytes]]:
    """A set of ``n`` records with every field kind, in ``shards`` shards, with its manifest."""
    manifest = str(tmp_path / "data.stoker.json")
    entries, images = [], []
    per = -(-n // shards)
    for s in range(shards):
        w = RecordWriter(tmp_path / f"data-{s}.rec", schema=SCHEMA, checksums=True)
        for i in range(s * per, min(n, (s + 1) * per)):
            images.append(image(i))
            w.write(i, pack_header(IRHeader(0, float(i % 3), i, 0), images[-1]), _values(i))
        entries.append(shard_entry(w.commit(), manifest))
    write_manifest(manifest, make_manifest(entries, schema=SCHEMA.to_json()))
    return manifest, images


def _same(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k, v in a.items():
        got = b[k]
        if isinstance(v, np.ndarray) or isinstance(v, np.generic):
            assert np.asarray(got).dtype == np.asarray(v).dtype, k
            np.testing.assert_array_equal(got, v, err_msg=k)
        else:
            assert got == v and type(got) is type(v), k


# ---------------------------------------------------------------- the trailer itself
def test_trailer_round_trips_every_kind_and_names_its_layout() -> None:
    values = {n: SCHEMA[n].check(v, name=n) for n, v in _values(5).items()}
    image = _jpeg(5)
    blob = image + encode_trailer(SCHEMA, values)
    assert blob.endswith(TRAILER_MAGIC)
    got_image, body = split_trailer(blob)
    assert bytes(got_image) == image
    (length,) = struct.unpack("<I", blob[-8:-4])
    assert length == len(body) == len(blob) - len(image) - 8
    _same(values, decode_trailer(SCHEMA, body))
    # the byte layout of docs/format.md: numeric raw, ragged count + rows, bytes length + bytes
    b = bytes(body)
    n_boxes = struct.unpack_from("<I", b, 0)[0]
    assert n_boxes == 1 and b[4:20] == values["boxes"].astype("<f4").tobytes()
    assert b[-2:] == struct.pack("<h", 1995)
    assert b[-14:-2] == np.array([5, -5, 0.5], "<f4").tobytes()
    # only some names: the others are skipped, not decoded
    assert set(decode_trailer(SCHEMA, body, ["caption"])) == {"caption"}


def test_a_schema_without_stored_fields_has_no_trailer() -> None:
    assert encode_trailer(Schema.classification(), {}) == b""


@pytest.mark.parametrize(
    ("cut", "words"),
    [
        (lambda b: b[:-1], "last 4 bytes"),
        (lambda b: b[:-8] + struct.pack("<I", 10**6) + TRAILER_MAGIC, "trailer length"),
    ],
)
def test_a_bad_tail_is_a_trailer_error(cut, words) -> None:
    values = {n: SCHEMA[n].check(v, name=n) for n, v in _values(2).items()}
    with pytest.raises(TrailerError, match=words):
        split_trailer(cut(_jpeg(2) + encode_trailer(SCHEMA, values)))


# ---------------------------------------------------------------- records with fields
@pytest.mark.parametrize("shards", [1, 3])
def test_read_fields_gives_back_every_field_and_read_header_the_image_alone(
    tmp_path, shards
) -> None:
    manifest, images = _write_set(tmp_path, 9, shards=shards)
    with RecordIOReader(manifest, checksums=True) as r:
        assert r.schema == SCHEMA
        assert _at(r, 0)[0].plain_reader() is None  # records of this set end in a trailer
        every, caption, plain = (
            r.reader(None, n) for n in (tuple(SCHEMA.stored), ("caption",), ())
        )
        for i in range(len(r)):
            f, p = _at(r, i)
            header, image, fields = f.read_fields(p)
            assert bytes(image) == images[i]
            assert header.label == float(i % 3)
            want = {n: SCHEMA[n].check(v, name=n) for n, v in _values(i).items()}
            _same(want, fields)
            _same(want, every(i)[3])
            assert bytes(f.read_header(p)[1]) == bytes(plain(i)[0]) == images[i]
            _same({"caption": want["caption"]}, caption(i)[3])
        with pytest.raises(SpecError, match="nothing"):
            r.reader(None, ("nothing",))
        assert r.labels().tolist() == [i % 3 for i in range(9)]


def test_mxnet_reads_the_image_and_first_label_of_a_record_with_fields(tmp_path) -> None:
    """What ``mx.recordio.unpack_img`` does: the IRHeader label, then ``cv2.imdecode`` of every
    byte after the labels; JPEG and PNG decoders stop at their end marker."""
    for image in (_jpeg, _png):
        sub = tmp_path / image.__name__.strip("_")
        sub.mkdir()
        manifest, images = _write_set(sub, 4, image=image)
        with RecordIOReader(manifest) as r:
            for i in range(4):
                f, p = _at(r, i)
                payload = bytes(f.read(p))
                flag, label = struct.unpack_from("<If", payload)
                assert flag == 0 and label == float(i % 3)
                after = np.frombuffer(payload[IR_SIZE:], np.uint8)
                assert len(after) > len(images[i])  # the trailer is there
                got = cv2.imdecode(after, cv2.IMREAD_COLOR)
                want = cv2.imdecode(np.frombuffer(images[i], np.uint8), cv2.IMREAD_COLOR)
                assert got is not None and np.array_equal(got, want)


def test_old_sets_load_unchanged(tmp_path) -> None:
    rec = tmp_path / "old.rec"
    with RecordWriter(rec) as w:
        for i in range(5):
            w.write(i, pack_header(IRHeader(0, float(i), i, 0), _jpeg(i)))
    with RecordIOReader(rec) as r:
        f, p = _at(r, 3)
        assert f.schema == Schema.classification((), "float32")
        assert f.plain_reader() is not None
        header, image, fields = f.read_fields(p)
        assert fields == {} and bytes(image) == _jpeg(3) and header.label == 3.0
        with pytest.raises(SpecError, match="stores none"):
            r.reader(None, ("boxes",))
    src = RecordSource(rec)
    assert src.schema == Schema.classification((), "int64")
    assert src.reader(np.arange(5), ())(2)[1:] == (2, 2, {})


def _corrupt(manifest: str, key: int, at_from_end: int, value: bytes) -> tuple[int, str]:
    """Overwrite bytes ``at_from_end`` before the end of record ``key``'s payload (keeping
    the manifest's recorded size: only the bytes change); returns the record's file offset."""
    with RecordIOReader(manifest) as r:
        shard = r.shard(0)._file()
        rec = shard.path
        pos = shard.positions([key])[0]
        off = shard.offset(int(pos))
        length = len(shard.read(int(pos)))
    with open(rec, "r+b") as f:
        f.seek(off + 8 + length - at_from_end)
        f.write(value)
    return off, rec


def test_a_damaged_trailer_names_the_file_key_offset_and_field(tmp_path) -> None:
    manifest, _ = _write_set(tmp_path, 6)
    with RecordIOReader(manifest) as r:
        f, p = _at(r, 5)
        payload = bytes(f.read(p))
    length = struct.unpack("<I", payload[-8:-4])[0]
    # the year field (int16, last) cannot be damaged into a short read; the length word can
    off, rec = _corrupt(manifest, 5, 8, struct.pack("<I", length - 1))
    with RecordIOReader(manifest, checksums=False) as r, pytest.raises(CorruptRecordError) as e:
        r.reader(None, tuple(SCHEMA.stored))(5)
    err = e.value
    assert err.path == rec and err.key == 5 and "field trailer" in str(err)
    # one byte less of body: the first field starts one byte later, and so on to the end
    assert err.offset is not None and err.offset > off
    assert "field 'boxes'" in str(err) and "rows of 16 bytes" in str(err)

    # the magic gone: read_header refuses rather than hand back the trailer as image
    (tmp_path / "b").mkdir()
    manifest2, _ = _write_set(tmp_path / "b", 4)
    off, rec = _corrupt(manifest2, 2, 4, b"XXXX")
    with RecordIOReader(manifest2, checksums=False) as r:
        with pytest.raises(CorruptRecordError, match="key 2.*byte offset.*STKF"):
            r.read(2)
        assert bytes(r.read(1)[0]) == _jpeg(1)


def test_a_text_field_that_is_not_utf8_names_the_field_and_its_byte(tmp_path) -> None:
    manifest, _ = _write_set(tmp_path, 4)
    with RecordIOReader(manifest) as r:
        f, p = _at(r, 1)
        at = bytes(f.read(p)).index("ünïcode ✓ 1".encode())
        off = r.locate(1)[1]
    with open(tmp_path / "data-0.rec", "r+b") as f:
        f.seek(off + 8 + at)
        f.write(b"\xff")
    with RecordIOReader(manifest, checksums=False) as r, pytest.raises(CorruptRecordError) as e:
        r.reader(None, ("caption",))(1)
    assert "field 'caption'" in str(e.value) and "UTF-8" in str(e.value)
    assert e.value.offset == off + 8 + at and e.value.key == 1


def test_a_manifest_with_a_bad_schema_is_refused(tmp_path) -> None:
    manifest, _ = _write_set(tmp_path, 2)
    path = Path(manifest)
    m = json.loads(path.read_text())
    m["schema"]["fields"][2]["kind"] = "polygon"
    path.write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="fields\\[2\\].*boxes"):
        RecordIOReader(manifest)


def test_the_writer_checks_each_records_fields(tmp_path) -> None:
    w = RecordWriter(tmp_path / "w.rec", schema=SCHEMA)
    head = pack_header(IRHeader(0, 0.0, 0, 0), _jpeg(0))
    bad = {**_values(1), "boxes": [[1, 2, 3]]}
    with pytest.raises(ValueError, match="key 7.*'boxes'.*shape"):
        w.write(7, head, bad)
    with pytest.raises(ValueError, match="key 8.*'caption'"):
        w.write(8, head, {k: v for k, v in _values(1).items() if k != "caption"})
    w.abort()
    w2 = RecordWriter(tmp_path / "plain.rec")
    with pytest.raises(ValueError, match="stores none"):
        w2.write(0, head, {"caption": "x"})
    w2.abort()


# ---------------------------------------------------------------- RecordSource
@pytest.mark.parametrize("shards", [1, 2])
def test_record_source_reader_gives_what_field_check_gives(tmp_path, shards) -> None:
    manifest, images = _write_set(tmp_path, 7, shards=shards)
    src = RecordSource(manifest)
    want_schema = SCHEMA  # its header field is int64 as the labels are whole numbers
    assert src.schema == want_schema
    names = ("boxes", "classes", "caption", "mask", "year")
    for s in (src, pickle.loads(pickle.dumps(src))):  # in the process that opened it, a worker
        read = s.reader(np.arange(7), names)
        for i in range(7):
            payload, label, key, fields = read(i)
            assert bytes(payload) == images[i] and key == i and label == i % 3
            want = {n: SCHEMA[n].check(_values(i)[n], name=n) for n in names}
            _same(want, fields)
        assert s.read(3)[0].tobytes() == images[3]
    with pytest.raises(SpecError, match="nothing"):
        src.reader(None, ("nothing",))
    src.close()


def test_record_source_schema_types_the_header_field_as_labels(tmp_path) -> None:
    schema = Schema(
        {
            "image": Field.image(),
            "scores": Field.numeric((2,), "float32", header=True),
            "caption": Field.text(),
        }
    )
    rec = tmp_path / "s.rec"
    w = RecordWriter(rec, schema=schema)
    for i in range(3):
        w.write(i, pack_header(IRHeader(0, [i + 0.5, 1.0], i, 0), _jpeg(i)), {"caption": f"c{i}"})
    manifest = str(tmp_path / "s.stoker.json")
    write_manifest(
        manifest, make_manifest([shard_entry(w.commit(), manifest)], schema=schema.to_json())
    )
    src = RecordSource(manifest)
    assert src.schema["scores"] == Field.numeric((2,), "float32", header=True)
    payload, label, key, fields = src.reader(None, ("caption",))(2)
    np.testing.assert_array_equal(label, [2.5, 1.0])
    assert fields == {"caption": "c2"}
    src.close()
