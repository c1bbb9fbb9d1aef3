"""RecordWriter: atomic outputs, overwrite policy, resume after a killed run."""

from __future__ import annotations

import os

import crc32c
import numpy as np
import pytest
from _recordio_util import MAGIC_LE, payload, write_rec

from stoker._core.errors import OutputExistsError
from stoker.formats.recordio import RecordFile, RecordWriter


def _files(d):
    return sorted(os.listdir(d))


def test_nothing_final_until_commit(tmp_path):
    w = RecordWriter(tmp_path / "a.rec", checksums=True)
    w.write(0, b"x" * 10)
    assert _files(tmp_path) == ["a.crc32c.partial", "a.idx.partial", "a.rec.partial"]
    info = w.commit()
    assert _files(tmp_path) == ["a.crc32c", "a.idx", "a.rec"]
    assert (info.records, info.rec_bytes) == (1, 20)
    assert info.crc32c == str(tmp_path / "a.crc32c")
    import hashlib

    assert info.idx_sha256 == hashlib.sha256(b"0\t0\n").hexdigest()
    with pytest.raises(ValueError, match="already committed"):
        w.write(1, b"y")


def test_exception_in_context_removes_partials(tmp_path):
    with pytest.raises(RuntimeError), RecordWriter(tmp_path / "a.rec") as w:
        w.write(0, b"abc")
        raise RuntimeError("boom")
    assert _files(tmp_path) == []


def test_refuses_existing_outputs_and_keeps_them_on_failed_overwrite(tmp_path):
    rec = write_rec(tmp_path, [payload(i) for i in range(3)], name="a")
    before = {n: (tmp_path / n).read_bytes() for n in _files(tmp_path)}
    with pytest.raises(OutputExistsError, match="overwrite=True"):
        RecordWriter(rec)
    with pytest.raises(OutputExistsError):
        RecordWriter(tmp_path / "b.rec", idx_path=tmp_path / "a.idx")
    # overwrite that fails midway: old files intact, no partials left
    with pytest.raises(KeyError), RecordWriter(rec, overwrite=True, checksums=True) as w:
        w.write(0, b"new")
        raise KeyError("packer failed")
    after = {n: (tmp_path / n).read_bytes() for n in _files(tmp_path) if "stkidx" not in n}
    assert after == before


def test_keys_must_be_non_negative_integers(tmp_path):
    with RecordWriter(tmp_path / "k.rec") as w:
        for bad in (-1, 2**63, "3", 1.5):
            with pytest.raises((ValueError, TypeError)):
                w.write(bad, b"x")  # type: ignore[arg-type]
        w.write(np.int64(4), bytearray(b"ok"))
        w.write(5, np.arange(3, dtype=np.uint8))
        w.write(6, memoryview(np.arange(4, dtype=np.int32)))
    with RecordFile(tmp_path / "k.rec") as r:
        assert r.keys.tolist() == [4, 5, 6]
        assert bytes(r.read(1)) == b"\x00\x01\x02"
        assert bytes(r.read(2)) == np.arange(4, dtype=np.int32).tobytes()


def test_crc_file_matches_payloads(tmp_path):
    ps = [payload(i) for i in range(10)] + [MAGIC_LE * 3]
    rec = write_rec(tmp_path, ps, checksums=True)
    stored = np.fromfile(rec[:-4] + ".crc32c", dtype="<u4")
    assert stored.tolist() == [crc32c.crc32c(p) for p in ps]
