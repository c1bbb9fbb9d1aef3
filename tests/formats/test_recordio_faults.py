"""Damaged .rec/.idx files (faults.md B3 #26-#37): clear errors naming file, key, offset and
.idx line; nothing allocated from an unchecked length; undamaged records stay readable."""

from __future__ import annotations

import contextlib
import os
import struct
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest
from _recordio_util import MAGIC_LE, payload, write_rec

from stoker._core.errors import CorruptRecordError, IndexFormatError, StokerFormatError
from stoker.formats.recordio import (
    IRHeader,
    RecordFile,
    RecordWriter,
    pack_header,
    verify_records,
)


@pytest.fixture
def three(tmp_path):
    """Three records of 40-ish bytes; returns (rec path, payloads, offsets)."""
    ps = [payload(i, size=13 + i) for i in range(3)]
    rec = write_rec(tmp_path, ps, checksums=False)
    with RecordFile(rec) as r:
        offs = r.offsets.tolist()
    return rec, ps, offs


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


# --------------------------------------------------------------------------- #26 truncation
def test_truncation_at_every_k(tmp_path, three):
    rec, ps, offs = three
    full = _read(rec)
    idx_text = _read(rec[:-4] + ".idx")
    last = len(full) - offs[2]
    for k in range(1, last + 1):
        cut = tmp_path / f"cut{k}.rec"
        cut.write_bytes(full[: len(full) - k])
        (tmp_path / f"cut{k}.idx").write_bytes(idx_text)
        if k == last:
            # nothing of record 2 left: the .idx names an offset past the end, at open
            with pytest.raises(IndexFormatError) as ei:
                RecordFile(cut)
            assert ei.value.line == 3 and "past the end" in str(ei.value)
            continue
        with RecordFile(cut) as r:
            assert bytes(r.read(0)) == ps[0] and bytes(r.read(1)) == ps[1]
            with pytest.raises(CorruptRecordError) as ei:
                r.read(2)
            e = ei.value
            assert (e.key, e.offset, e.idx_line) == (2, offs[2], 3)
            assert "truncated" in e.reason and str(cut) in str(e)
        rep = verify_records(cut, checksums=False)
        assert not rep.ok and rep.problems[0].offset == offs[2]
        assert "truncated" in rep.problems[0].reason


# --------------------------------------------------------------------------- #27 bad magic
def test_every_magic_bit_flip_is_detected(three):
    rec, ps, offs = three
    original = _read(rec)[offs[1] : offs[1] + 4]
    detected = 0
    for bit in range(32):
        word = struct.unpack("<I", original)[0] ^ (1 << bit)
        _patch(rec, offs[1], struct.pack("<I", word))
        with RecordFile(rec, cache=False) as r:
            with pytest.raises(CorruptRecordError) as ei:
                r.read(1)
            assert f"bad magic 0x{word:08x}" in str(ei.value)
            assert (ei.value.key, ei.value.offset, ei.value.idx_line) == (1, offs[1], 2)
            assert bytes(r.read(0)) == ps[0] and bytes(r.read(2)) == ps[2]
            detected += 1
    _patch(rec, offs[1], original)
    assert detected == 32


# --------------------------------------------------------------------------- #28 huge length
@contextlib.contextmanager
def _traced_peak():
    """A list that holds the peak of the Python allocations made in the block, once it ends."""
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield peak
        peak.append(tracemalloc.get_traced_memory()[1])
    finally:
        tracemalloc.stop()


def test_huge_length_is_refused_before_allocating(three):
    rec, ps, offs = three
    _patch(rec, offs[1] + 4, struct.pack("<I", 0x1FFFFFFF))  # cflag 0, length 2^29-1
    with RecordFile(rec) as r:
        with _traced_peak() as peak:
            with pytest.raises(CorruptRecordError, match="truncated") as ei:
                r.read(1)
            with pytest.raises(CorruptRecordError):
                r.labels()
        assert peak[0] < 10 << 20
        assert ei.value.key == 1 and ei.value.offset == offs[1]
        assert bytes(r.read(2)) == ps[2]


# --------------------------------------------------------------------------- #29 idx lines
def _write_idx(rec, text):
    """Replace the ``.idx`` beside ``rec`` with ``text``, line ends as given."""
    with open(rec[:-4] + ".idx", "w", newline="") as f:
        f.write(text)


BAD_LINES = [
    ("x1\t{o}\n", "key is not a non-negative integer"),
    ("1\t{o}z\n", "offset is not a non-negative integer"),
    ("1 {o}\n", "found no tab"),
    ("1\n", "found no tab"),
    ("1\t{o}\t7\n", "2 tabs"),
    ("1\t-{o}\n", "negative offset"),
    ("-1\t{o}\n", "negative key"),
    ("\t{o}\n", "empty key"),
    ("1\t\n", "empty offset"),
    ("1\t999996\n", "past the end"),
    ("1\t{o2}\n", "not a multiple of 4"),
    ("1\t1{z}\n", "too many digits"),
    ("1\t1.5\n", "not a non-negative integer"),
    ("1\t0x10\n", "not a non-negative integer"),
]


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_malformed_idx_line_names_its_line(three, line, reason):
    rec, _, offs = three
    idx = rec[:-4] + ".idx"
    text = f"0\t{offs[0]}\n" + line.format(o=offs[1], o2=offs[1] + 2, z="0" * 30)
    text += f"2\t{offs[2]}\n"
    with open(idx, "w") as f:
        f.write(text)
    with pytest.raises(IndexFormatError) as ei:
        RecordFile(rec)
    assert ei.value.line == 2 and reason in str(ei.value), str(ei.value)
    assert idx in str(ei.value)


@pytest.mark.parametrize(
    "text",
    [
        "0\t{0}\r\n1\t{1}\r\n2\t{2}\r\n",  # CRLF
        "0\t{0}\n1\t{1}\n2\t{2}",  # no final newline
        "0\t{0}\r\n1\t{1}\r\n2\t{2}",
        "\n0\t{0}\n\n1\t{1}\n   \n2\t{2}\n\n",  # blank lines
        "0\t{0}\n1\t{1}\n2\t{2}\n\n\n",
    ],
)
def test_tolerated_idx_variants(three, text):
    rec, ps, offs = three
    _write_idx(rec, text.format(*offs))
    with RecordFile(rec) as r:
        assert len(r) == 3 and [bytes(r.read(i)) for i in range(3)] == ps


def test_line_numbers_count_blank_lines(three):
    rec, _, offs = three
    _write_idx(rec, f"\n\n0\t{offs[0]}\n\n1\t{offs[1] + 4}\n2\t{offs[2]}\n")
    with RecordFile(rec) as r:
        with pytest.raises(CorruptRecordError) as ei:
            r.read(1)
        assert ei.value.idx_line == 5
        assert r.idx_line(2) == 6


# --------------------------------------------------------------------------- #30 mid-record
def test_mid_record_offset(three):
    rec, ps, offs = three
    _write_idx(rec, f"0\t{offs[0]}\n1\t{offs[1] + 4}\n2\t{offs[2]}\n")
    with RecordFile(rec) as r:
        with pytest.raises(CorruptRecordError) as ei:
            r.read(1)
        assert (ei.value.key, ei.value.idx_line, ei.value.offset) == (1, 2, offs[1] + 4)
        assert "bad magic" in ei.value.reason
    rep = verify_records(rec, checksums=False)
    assert [(p.key, p.offset, p.idx_line) for p in rep.problems] == [
        (1, offs[1] + 4, 2),
        (None, offs[1], None),
    ]
    assert "not the start of a record" in rep.problems[0].reason
    assert "not listed in the .idx" in rep.problems[1].reason


def test_offset_into_the_middle_of_a_split_record(tmp_path):
    p = b"abcd" + MAGIC_LE + b"efgh"  # parts: cflag 1 (abcd), cflag 3 (efgh) at offset 12
    rec = write_rec(tmp_path, [p], checksums=False)
    (tmp_path / "data.idx").write_text("0\t12\n")
    with RecordFile(rec) as r, pytest.raises(CorruptRecordError, match="broken multi-part"):
        r.read(0)


# --------------------------------------------------------------------------- #31 duplicates
def test_duplicate_keys_name_both_lines(three):
    rec, _, offs = three
    _write_idx(rec, f"0\t{offs[0]}\n7\t{offs[1]}\n0\t{offs[2]}\n")
    with pytest.raises(IndexFormatError) as ei:
        RecordFile(rec)
    assert ei.value.line == 3 and "duplicate key 0 (also on line 1)" in str(ei.value)


def test_writer_refuses_duplicate_keys(tmp_path):
    with RecordWriter(tmp_path / "d.rec") as w:
        w.write(5, b"a")
        w.write(2, b"b")
        with pytest.raises(ValueError, match="key 5 was already written"):
            w.write(5, b"c")
        w.write(9, b"d")


# --------------------------------------------------------------------------- #33 payload flip
def test_payload_bit_flip_flags_exactly_that_key(tmp_path):
    ps = [payload(i, size=20) for i in range(200)]
    rec = write_rec(tmp_path, ps, checksums=True)
    with RecordFile(rec) as r:
        off = r.offset(137)
    with open(rec, "r+b") as f:
        f.seek(off + 8 + 30)
        b = f.read(1)
        f.seek(off + 8 + 30)
        f.write(bytes([b[0] ^ 0x10]))
    with RecordFile(rec, verify_checksums=True) as r:
        bad = []
        for i in range(len(r)):
            try:
                assert bytes(r.read(i)) == ps[i]
            except CorruptRecordError as e:
                assert "checksum mismatch" in e.reason and e.offset == off
                bad.append(e.key)
        assert bad == [137]
    # without checksums the container cannot see it (documented): the bytes come back as stored
    with RecordFile(rec) as r:
        assert bytes(r.read(137)) != ps[137]
    rep = verify_records(rec)
    assert [p.key for p in rep.problems] == [137] and rep.checksummed == 200


def test_checksum_file_of_wrong_length(tmp_path):
    rec = write_rec(tmp_path, [payload(i) for i in range(4)], checksums=True)
    with open(tmp_path / "data.crc32c", "ab") as f:
        f.write(b"\x00\x00")
    with pytest.raises(CorruptRecordError, match="checksum file holds 18 bytes"):
        RecordFile(rec, verify_checksums=True)
    with pytest.raises(CorruptRecordError, match="does not exist"):
        RecordFile(rec, verify_checksums=True, crc_path=tmp_path / "nope.crc32c")


# --------------------------------------------------------------------------- #34 flag
def test_corrupted_label_count_is_bounded(three):
    rec, ps, offs = three
    _patch(rec, offs[1] + 8, struct.pack("<I", 2**31))
    with RecordFile(rec) as r:
        with _traced_peak() as peak:
            with pytest.raises(CorruptRecordError) as ei:
                r.read_header(1)
            with pytest.raises(CorruptRecordError):
                r.labels()
        assert peak[0] < 10 << 20
        assert "flag 2147483648" in ei.value.reason and ei.value.key == 1
        assert r.labels([0, 2]).tolist() == [0.0, 2.0]


# --------------------------------------------------------------------------- #35 chains
def _lrec(cflag, n):
    return struct.pack("<I", cflag << 29 | n)


@pytest.mark.parametrize(
    ("first", "second", "reason"),
    [
        (1, 0, "has cflag 0, expected 2 or 3"),
        (1, 1, "has cflag 1, expected 2 or 3"),
        (3, 3, "first part has cflag 3"),
        (2, 3, "first part has cflag 2"),
    ],
)
def test_broken_multi_part_chain(tmp_path, first, second, reason):
    p = b"abcd" + MAGIC_LE + b"efgh"
    rec = write_rec(tmp_path, [p, b"tail"], checksums=False)
    _patch(rec, 4, _lrec(first, 4))
    _patch(rec, 16, _lrec(second, 4))
    with RecordFile(rec) as r:
        with pytest.raises(CorruptRecordError) as ei:
            r.read(0)
        assert "broken multi-part record" in ei.value.reason and reason in ei.value.reason
        assert ei.value.key == 0 and ei.value.offset == 0
        assert bytes(r.read(1)) == b"tail"


def test_split_record_cut_after_first_part(tmp_path):
    rec = write_rec(tmp_path, [b"abcd" + MAGIC_LE + b"efgh"], checksums=False)
    with open(rec, "r+b") as f:
        f.truncate(12)
    with RecordFile(rec) as r, pytest.raises(CorruptRecordError, match="truncated"):
        r.read(0)


# --------------------------------------------------------------------------- #36 empty
def test_empty_dataset(tmp_path):
    (tmp_path / "e.rec").write_bytes(b"")
    (tmp_path / "e.idx").write_bytes(b"")
    with RecordFile(tmp_path / "e.rec") as r:
        assert len(r) == 0 and r.keys.shape == (0,) and r.labels().shape == (0,)
        with pytest.raises(IndexError):
            r.read(0)
    rep = verify_records(tmp_path / "e.rec")
    assert rep.ok and rep.records == 0
    with RecordWriter(tmp_path / "w.rec"):
        pass
    assert (tmp_path / "w.rec").read_bytes() == b"" and (tmp_path / "w.idx").read_bytes() == b""
    with RecordFile(tmp_path / "w.rec") as r:
        assert len(r) == 0


# --------------------------------------------------------------------------- #37 replace
def test_replace_while_open_keeps_old_reader_valid(tmp_path):
    old = [payload(i, size=50) for i in range(20)]
    rec = write_rec(tmp_path, old)
    r = RecordFile(rec)
    try:
        new = [payload(100 + i, size=10) for i in range(5)]
        with RecordWriter(rec, overwrite=True, checksums=True) as w:
            for i, p in enumerate(new):
                w.write(i, p)
        assert [bytes(r.read(i)) for i in range(20)] == old
        with RecordFile(rec) as r2:
            assert [bytes(r2.read(i)) for i in range(5)] == new
    finally:
        r.close()


def test_truncated_in_place_while_open_is_an_error_not_sigbus(tmp_path):
    rec = write_rec(tmp_path, [payload(i, size=3000) for i in range(6)])
    script = textwrap.dedent(
        f"""
        import os
        from stoker.formats.recordio import RecordFile
        from stoker._core.errors import CorruptRecordError
        r = RecordFile({str(rec)!r})
        bytes(r.read(5))
        with open({str(rec)!r}, "r+b") as f:
            f.truncate(100)
        try:
            bytes(r.read(5))
        except CorruptRecordError as e:
            print("ERR", e.key, "truncated in place" in str(e))
        r.close()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ERR", "5", "True"]


# --------------------------------------------------------------------------- B1 #17
class _LengthOnly:
    """Claims 2^29 bytes without holding them: the guard must not touch the data."""

    def __len__(self):
        return 1 << 29

    def __buffer__(self, flags):  # pragma: no cover - must never be reached
        raise AssertionError("payload data was read before the size check")


def test_record_size_limit_checked_before_reading(tmp_path):
    with RecordWriter(tmp_path / "big.rec") as w:
        with pytest.raises(ValueError) as ei:
            w.write(42, _LengthOnly())  # type: ignore[arg-type]
        assert "record exceeds RecordIO limit (2^29-1 bytes)" in str(ei.value)
        assert "key 42" in str(ei.value)
        assert w.count == 0 and w.bytes_written == 0
        w.write(1, b"ok")  # the writer is still usable
    with RecordFile(tmp_path / "big.rec") as r:
        assert len(r) == 1


def test_errors_are_one_family(three):
    rec, _, offs = three
    _patch(rec, offs[0], b"\x00\x00\x00\x00")
    with RecordFile(rec) as r, pytest.raises(StokerFormatError):
        r.read(0)
    assert issubclass(IndexFormatError, StokerFormatError)


def test_labels_report_the_broken_record(three):
    rec, _, offs = three
    _patch(rec, offs[2], b"\xff\xff\xff\xff")
    with RecordFile(rec) as r:
        with pytest.raises(CorruptRecordError) as ei:
            r.labels()
        assert ei.value.key == 2 and ei.value.idx_line == 3
        np.testing.assert_array_equal(r.labels([0, 1]), [0.0, 1.0])


def test_read_after_close_is_a_clear_error(three):
    rec, _, _ = three
    r = RecordFile(rec)
    r.close()
    with pytest.raises(ValueError, match="closed"):
        r.read(0)


def test_multi_label_header_round_trip_through_file(tmp_path):
    rec = tmp_path / "ml.rec"
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(0, [0.25, 7, 1e6], 1, 2), b"jpeg"))
    with RecordFile(rec) as r:
        h, img = r.read_header(0)
        assert h.flag == 3 and h.label.tolist() == [0.25, 7.0, 1e6] and bytes(img) == b"jpeg"
    assert os.path.getsize(rec) == 8 + 24 + 12 + 4
