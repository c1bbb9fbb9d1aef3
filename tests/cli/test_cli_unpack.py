"""`stoker unpack` of an insightface set writes its images only, and checks CRC32C."""

from __future__ import annotations

import os

import pytest

from stoker._core.errors import CorruptRecordError
from stoker.cli.unpack import unpack
from stoker.formats.recordio import IRHeader, RecordFile, RecordWriter, pack_header


def test_unpack_of_an_insightface_set_writes_the_images_only(tmp_path):
    rec = tmp_path / "faces.rec"
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(0, [4, 6], 0, 0), b""))
        for k, ident in ((1, 0), (2, 0), (3, 1)):
            w.write(k, pack_header(IRHeader(0, float(ident), k, 0), b"face%d" % k))
        w.write(4, pack_header(IRHeader(0, [1, 3], 0, 0), b""))
        w.write(5, pack_header(IRHeader(0, [3, 4], 0, 0), b""))
    out = tmp_path / "out"
    assert unpack(str(rec), str(out), progress=False) == 3
    assert sorted(os.listdir(out)) == ["0", "1"]
    assert sorted(os.listdir(out / "0")) == ["1.bin", "2.bin"]


def test_unpack_checks_the_checksums(tmp_path):
    rec = tmp_path / "d.rec"
    with RecordWriter(rec, checksums=True) as w:
        for k in range(3):
            w.write(k, pack_header(IRHeader(0, 1.0, k, 0), b"payload-%d" % k))
    with RecordFile(rec) as r:
        off = r.offset(1)
    data = bytearray(rec.read_bytes())
    data[off + 8 + 24] ^= 1
    rec.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="key 1, byte offset"):
        unpack(str(rec), str(tmp_path / "out"), progress=False)
