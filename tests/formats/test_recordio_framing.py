"""``framing``: one record's bytes written and read back, and what a damaged frame reports."""

from __future__ import annotations

import mmap

import pytest
from _recordio_util import MAGIC_LE, naive_frame, payload

from stoker.formats.recordio.framing import (
    MAX_RECORD_BYTES,
    FrameError,
    decode_lrec,
    encode_lrec,
    frame_parts,
    frame_record,
    next_magic,
    pad4,
    read_record,
)


def _read_back(framed: bytes) -> tuple[bytes, int]:
    payload_view, end = read_record(framed, memoryview(framed), len(framed), 0)
    return bytes(payload_view), end


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"abc",
        payload(3, size=41),
        b"abcd" + MAGIC_LE + b"ef",  # split once
        MAGIC_LE * 3 + b"tail",  # split at every aligned word
        b"a" + MAGIC_LE + b"bcd",  # unaligned magic: not split
    ],
)
def test_one_record_round_trips(data):
    framed = frame_record(data)
    assert framed == naive_frame(data) == b"".join(frame_parts(data))
    assert len(framed) % 4 == 0
    got, end = _read_back(framed)
    assert got == data and end == len(framed)


def test_lrec_word_and_padding():
    assert decode_lrec(encode_lrec(3, 10)) == (3, 10)
    assert [pad4(n) for n in (0, 1, 4, 5)] == [0, 4, 4, 8]
    with pytest.raises(ValueError, match="cflag"):
        encode_lrec(4, 1)
    with pytest.raises(ValueError, match="RecordIO limit"):
        encode_lrec(0, MAX_RECORD_BYTES + 1)


def test_damaged_frames_raise_frame_error_with_the_record_offset():
    framed = frame_record(b"abcd" + MAGIC_LE + b"efgh")
    with pytest.raises(FrameError) as ei:
        _read_back(framed[:-4])  # the last part cut short
    assert ei.value.offset == 0 and ei.value.truncated and "multi-part" in ei.value.reason
    with pytest.raises(FrameError, match="bad magic") as ei:
        _read_back(b"\x00" * 4 + framed[4:])
    assert not ei.value.truncated
    second = framed.index(MAGIC_LE, 4)  # the middle of the split record
    with pytest.raises(FrameError, match="first part has cflag 3"):
        read_record(framed, memoryview(framed), len(framed), second)


def test_next_magic_skips_unaligned_magic(tmp_path):
    data = b"xx" + MAGIC_LE + b"yy" + frame_record(b"z")
    path = tmp_path / "m.bin"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert next_magic(mm, 0) == 8
        assert next_magic(mm, 9) == -1
