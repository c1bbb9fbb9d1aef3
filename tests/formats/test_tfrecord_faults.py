"""Damaged TFRecord files (faults.md B3): bit flips in the length, in each CRC and in the data,
truncation anywhere in the last record, protobuf lengths that run past the record. Each is a
clear error naming the file, the record and the byte offset, ``verify`` reports it, and
nothing is allocated from a length that was not checked."""

from __future__ import annotations

import struct
import tracemalloc

import numpy as np
import pytest
import simplejpeg

from stoker._core.errors import CorruptRecordError
from stoker._core.schema import Schema
from stoker.formats.tfrecord import (
    TFRecordReader,
    encode_example,
    masked_crc,
    open_writer,
    verify,
)


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


def jpeg(i: int) -> bytes:
    rng = np.random.default_rng(i)
    return simplejpeg.encode_jpeg(rng.integers(0, 255, (12, 16, 3), dtype=np.uint8))


@pytest.fixture
def three(tmp_path):
    """Three stoker-written records; (path, images, offsets of each record header)."""
    images = [jpeg(i) for i in range(3)]
    w = open_writer(tmp_path / "d", None, schema=Schema.classification())
    offsets = []
    for i, im in enumerate(images):
        offsets.append(w.bytes_written)
        w.write(i, im, i)
    path = w.commit()["files"]["data"]
    return path, images, offsets


def _flip(path: str, pos: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ (1 << bit)]))


def _length(path: str, off: int) -> int:
    with open(path, "rb") as f:
        f.seek(off)
        return struct.unpack("<Q", f.read(8))[0]


@pytest.mark.parametrize("pos", [0, 3, 7])
def test_a_bit_flip_in_the_length_fails_the_length_crc(three, pos):
    path, _images, offs = three
    _flip(path, offs[1] + pos, 5)
    with pytest.raises(CorruptRecordError, match="record 1: length CRC mismatch") as ei:
        TFRecordReader(path)
    assert ei.value.path == path and ei.value.offset == offs[1] and ei.value.key == 1
    report = verify(path)
    assert not report.ok and report.problems[0].offset == offs[1]
    assert report.problems[0].key == 1 and report.records == 1  # the walk stops there


def test_a_bit_flip_in_the_length_crc(three):
    path, _images, offs = three
    _flip(path, offs[2] + 9, 0)
    with pytest.raises(CorruptRecordError, match="record 2: length CRC mismatch") as ei:
        TFRecordReader(path)
    assert ei.value.offset == offs[2]
    assert not verify(path).ok


@pytest.mark.parametrize("where", ["data crc", "payload"])
def test_a_bit_flip_in_the_data_or_its_crc(three, where):
    path, images, offs = three
    n = _length(path, offs[1])
    with open(path, "rb") as fh:
        at = fh.read().find(images[1])
    assert offs[1] < at < offs[2]
    pos = offs[1] + 12 + n + 1 if where == "data crc" else at + len(images[1]) // 2
    _flip(path, pos, 3)
    with TFRecordReader(path) as r:  # the index and labels hold: the flip is in the data
        f = r.reader()
        assert bytes(f(0)[0]) == images[0] and bytes(f(2)[0]) == images[2]
        with pytest.raises(CorruptRecordError, match="record 1: data CRC mismatch") as ei:
            f(1)
        assert ei.value.path == path and ei.value.offset == offs[1] and ei.value.key == 1
    with TFRecordReader(path, checksums=False) as r:  # documented: no check, no error
        r.reader()(1)
    report = verify(path)
    assert not report.ok and report.problem_count == 1 and report.records == 3
    assert report.problems[0].offset == offs[1] and report.problems[0].key == 1
    assert "data CRC" in report.problems[0].reason


def test_truncation_anywhere_in_the_last_record(three, tmp_path):
    path, _images, offs = three
    with open(path, "rb") as fh:
        whole = fh.read()
    cuts = sorted(
        set(range(1, len(whole) - offs[2], 7)) | {1, 11, 12, 13, len(whole) - offs[2] - 1}
    )
    for k, cut in enumerate(cuts):
        p = tmp_path / f"cut{k}.tfrecord"
        p.write_bytes(whole[: offs[2] + cut])
        with pytest.raises(CorruptRecordError, match="record 2: truncated record") as ei:
            TFRecordReader(p)
        assert ei.value.path == str(p) and ei.value.offset == offs[2], cut
        report = verify(p)
        assert not report.ok and report.problems[0].offset == offs[2], cut
        assert report.records == 2


def _framed(data: bytes) -> bytes:
    head = struct.pack("<Q", len(data))
    return head + struct.pack("<I", masked_crc(head)) + data + struct.pack("<I", masked_crc(data))


def test_a_protobuf_length_that_runs_past_the_record(tmp_path):
    good = encode_example(
        [("image/encoded", "bytes", jpeg(0)), ("image/class/label", "int64", [1])]
    )
    # the same Example, but its outer field claims 1000 bytes more than the record holds
    body = good[1:]
    n, used = 0, 0
    for used, b in enumerate(body, 1):  # noqa: B007 - the varint's length
        n |= (b & 0x7F) << (7 * (used - 1))
        if not b & 0x80:
            break
    from stoker.formats.protowire import encode_varint

    bad = b"\x0a" + encode_varint(n + 1000) + body[used:]
    path = tmp_path / "wire.tfrecord"
    first = _framed(good)
    path.write_bytes(first + _framed(bad))
    with pytest.raises(CorruptRecordError, match="record 1: Example does not parse") as ei:
        TFRecordReader(path)
    # the byte at fault: the tag of the field whose length is wrong, in the second record
    assert ei.value.offset == len(first) + 12 and "claims" in ei.value.reason
    report = verify(path)
    assert not report.ok and report.problems[0].offset == len(first) + 12


def test_a_huge_claimed_length_allocates_nothing(three, tmp_path):
    path, _images, offs = three
    head = struct.pack("<Q", 1 << 40)  # a length CRC that matches: only the size check is left
    with open(path, "r+b") as f:
        f.seek(offs[1])
        f.write(head + struct.pack("<I", masked_crc(head)))
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match="claims 1099511627776 data bytes") as ei:
            TFRecordReader(path, cache=False)
        report = verify(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 << 20
    assert ei.value.offset == offs[1] and not report.ok


def test_an_example_without_an_image(tmp_path):
    path = tmp_path / "noimg.tfrecord"
    ex0 = encode_example([("image/encoded", "bytes", jpeg(0)), ("image/class/label", "int64", [0])])
    ex1 = encode_example([("image/class/label", "int64", [1])])
    path.write_bytes(_framed(ex0) + _framed(ex1))
    with pytest.raises(CorruptRecordError, match="record 1: field 'image'") as ei:
        TFRecordReader(path)
    assert ei.value.offset == len(_framed(ex0))
    report = verify(path)
    assert not report.ok and report.problems[0].key == 1


def test_verify_decodes_when_asked(three):
    from stoker.codecs import decode

    path, images, offs = three
    report = verify(path, decode=decode)
    assert report.ok and report.decoded == 3 and report.checksummed == 3
    with open(path, "rb") as fh:
        at = fh.read().find(images[1])
    _flip(path, at, 0)  # the JPEG's first marker byte: not an image any more
    report = verify(path, checksums=False, decode=decode)
    assert not report.ok and report.problem_count == 1 and report.decoded == 2
    assert report.problems[0].key == 1 and "does not decode" in report.problems[0].reason
    report = verify(path, decode=decode)  # with checksums, the CRC names it first
    assert report.problem_count == 1 and "data CRC" in report.problems[0].reason


def test_a_file_truncated_in_place_while_open(three):
    path, _images, offs = three
    with TFRecordReader(path) as r:
        f = r.reader()
        with open(path, "r+b") as fh:
            fh.truncate(offs[2])
        with pytest.raises(CorruptRecordError, match="truncated in place"):
            f(2)


def test_random_mutations_give_the_right_bytes_or_a_format_error(tmp_path):
    """faults.md B3 #38 for TFRecord: every mutation of a small detection file either reads
    back or raises a StokerFormatError (never another exception); verify never raises."""
    import random

    from stoker._core.errors import StokerFormatError
    from stoker._core.schema import Field

    schema = Schema(
        {
            "image": Field.image(),
            "label": Field.numeric((), "int64", header=True),
            "boxes": Field.boxes(),
            "classes": Field.ragged((), "int64", follows="boxes"),
            "caption": Field.text(),
        }
    )
    w = open_writer(tmp_path / "fz", None, schema=schema)
    for i in range(3):
        fields = {"boxes": [[1.0, 2.0, 5.0, 6.0]] * i, "classes": [i] * i, "caption": f"c{i}"}
        w.write(i, jpeg(i), i, fields)
    with open(w.commit()["files"]["data"], "rb") as fh:
        clean = fh.read()
    names = ("boxes", "classes", "caption")
    rng = random.Random(1234)
    path = tmp_path / "m.tfrecord"
    outcomes = {"read": 0, "error": 0}
    for _ in range(250):
        data = bytearray(clean)
        for _ in range(rng.choice((1, 1, 2, 3))):
            pos = rng.randrange(len(data))
            data[pos] = rng.choice((0, 0xFF, 0x80, rng.randrange(256), data[pos] ^ 1))
        path.write_bytes(bytes(data))
        try:
            with TFRecordReader(path, cache=False) as r:
                f = r.reader(None, tuple(n for n in names if n in r.schema))
                # with the CRCs checked, whatever reads is what was written
                assert [bytes(f(i)[0]) for i in range(len(r))] == [jpeg(i) for i in range(3)]
            outcomes["read"] += 1
        except StokerFormatError:
            outcomes["error"] += 1
        verify(path)  # never raises for damaged data
    assert outcomes["error"] > 100 and sum(outcomes.values()) == 250


def test_a_non_finite_float_label_is_named_once_with_key_and_offset(tmp_path):
    """A TFRecord another tool wrote, whose float label is NaN: verify and the reader name
    the record and the field (once)."""
    from tfrecord import TFRecordWriter

    path = str(tmp_path / "f.tfrecord")
    w = TFRecordWriter(path)
    for k, lab in enumerate([0.5, float("nan"), 1.5]):
        w.write({"image/encoded": (jpeg(k), "byte"), "image/class/label": (lab, "float")})
    w.close()
    offsets = [0, 16 + _length(path, 0)]  # a record: length, its CRC, the data, the data's CRC
    report = verify(path)
    assert [(p.key, p.offset) for p in report.problems] == [(1, offsets[1])]
    assert report.problems[0].reason == "record 1: field 'label': holds NaN or infinity"
    with pytest.raises(CorruptRecordError, match=r"key 1, .*: field 'label': holds NaN"):
        TFRecordReader(path).labels()
