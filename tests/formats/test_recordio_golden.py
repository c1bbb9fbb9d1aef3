"""The bytes on disk follow dmlc-core's RecordIO layout exactly.

Each golden string below is written out by hand from the layout (magic 0a 23 d7 ce, then
``lrec = cflag << 29 | length`` little-endian, payload, zero padding to 4 bytes), not produced
by stoker. The writer must produce them and the reader must read them back.
"""

from __future__ import annotations

import numpy as np
import pytest

from stoker.formats.recordio import (
    IRHeader,
    RecordFile,
    RecordWriter,
    frame_record,
    pack_header,
    unpack_header,
)

M = "0a23d7ce"  # the magic 0xced7230a, little-endian

GOLDEN = {
    # name: (payload, bytes on disk)
    "plain": (b"abcd", M + "04000000" + b"abcd".hex()),
    "padded": (b"abcdef", M + "06000000" + b"abcdef".hex() + "0000"),
    "one byte": (b"z", M + "01000000" + "7a" + "000000"),
    "empty": (b"", M + "00000000"),
    # magic at offset 0: first part (cflag 1) is empty, last part (cflag 3) holds the rest
    "magic at 0": (
        bytes.fromhex(M) + b"wxyz",
        M + "00000020" + M + "04000060" + b"wxyz".hex(),
    ),
    "magic at 4": (
        b"abcd" + bytes.fromhex(M) + b"ef",
        M + "04000020" + b"abcd".hex() + M + "02000060" + b"ef".hex() + "0000",
    ),
    "magic at 8 (end)": (
        b"abcdefgh" + bytes.fromhex(M),
        M + "08000020" + b"abcdefgh".hex() + M + "00000060",
    ),
    # magic at 0, 4 and 8: cflag 1, 2, 2, then 3
    "magic at 0, 4, 8": (
        bytes.fromhex(M * 3) + b"q",
        M + "00000020" + M + "00000040" + M + "00000040" + M + "01000060" + "71" + "000000",
    ),
    "magic at 4 and 12": (
        b"abcd" + bytes.fromhex(M) + b"efgh" + bytes.fromhex(M) + b"ij",
        M
        + "04000020"
        + b"abcd".hex()
        + M
        + "04000040"
        + b"efgh".hex()
        + M
        + "02000060"
        + b"ij".hex()
        + "0000",
    ),
    # an unaligned magic is left alone: one part
    "magic at 2 (unaligned)": (
        b"ab" + bytes.fromhex(M) + b"cd",
        M + "08000000" + (b"ab" + bytes.fromhex(M) + b"cd").hex(),
    ),
    # a magic that would end past the last aligned word is not a split point either
    "magic at 3 of 7": (
        b"abc" + bytes.fromhex(M),
        M + "07000000" + (b"abc" + bytes.fromhex(M)).hex() + "00",
    ),
}


@pytest.mark.parametrize("name", list(GOLDEN))
def test_frame_matches_golden(name):
    payload, disk = GOLDEN[name]
    assert frame_record(payload).hex() == disk


@pytest.mark.parametrize("name", list(GOLDEN))
def test_writer_file_and_idx_match_golden(tmp_path, name):
    payload, disk = GOLDEN[name]
    first = bytes.fromhex(GOLDEN["plain"][1])
    rec = tmp_path / "g.rec"
    with RecordWriter(rec) as w:
        assert w.write(5, b"abcd") == 0
        assert w.write(9, payload) == len(first)
    assert rec.read_bytes() == first + bytes.fromhex(disk)
    assert (tmp_path / "g.idx").read_bytes() == f"5\t0\n9\t{len(first)}\n".encode()


@pytest.mark.parametrize("name", list(GOLDEN))
def test_reader_reads_hand_built_file(tmp_path, name):
    payload, disk = GOLDEN[name]
    blob = bytes.fromhex(GOLDEN["padded"][1]) + bytes.fromhex(disk)
    (tmp_path / "h.rec").write_bytes(blob)
    (tmp_path / "h.idx").write_bytes(b"0\t0\n1\t16\n")
    with RecordFile(tmp_path / "h.rec") as r:
        assert len(r) == 2
        assert bytes(r.read(0)) == b"abcdef"
        assert bytes(r.read(1)) == payload
        assert r.offset(1) == 16
        assert r.keys.tolist() == [0, 1]
    # and without any .idx: walking the file finds the same two records
    (tmp_path / "h.idx").unlink()
    with RecordFile(tmp_path / "h.rec") as r:
        assert [bytes(r.read(i)) for i in range(len(r))] == [b"abcdef", payload]


def test_irheader_golden_scalar_label():
    got = pack_header(IRHeader(0, 2.5, 7, 9), b"xy")
    want = "00000000" + "00002040" + "0700000000000000" + "0900000000000000" + b"xy".hex()
    assert got.hex() == want
    h, img = unpack_header(got)
    assert h == IRHeader(0, 2.5, 7, 9) and bytes(img) == b"xy"


def test_irheader_golden_multi_label():
    got = pack_header(IRHeader(99, [1.0, 2.0], 3, 4), b"IMG")
    want = (
        "02000000"  # flag = number of labels (the flag passed in is ignored, as in MXNet)
        + "00000000"  # label field 0
        + "0300000000000000"
        + "0400000000000000"
        + "0000803f"  # 1.0f
        + "00000040"  # 2.0f
        + b"IMG".hex()
    )
    assert got.hex() == want
    h, img = unpack_header(got)
    assert h.flag == 2 and h.id == 3 and h.id2 == 4
    assert isinstance(h.label, np.ndarray) and h.label.dtype == np.float32
    assert h.label.tolist() == [1.0, 2.0] and bytes(img) == b"IMG"


def test_irheader_rejects_short_and_overlong_flag():
    with pytest.raises(ValueError, match="shorter than the 24-byte IRHeader"):
        unpack_header(b"\x00" * 23)
    bad = bytes.fromhex("05000000" + "00000000" + "00" * 16) + b"\x00" * 8  # 5 labels, 2 there
    with pytest.raises(ValueError, match="flag 5"):
        unpack_header(bad)
    with pytest.raises(ValueError):
        pack_header(IRHeader(0, 1.0, -1, 0))
