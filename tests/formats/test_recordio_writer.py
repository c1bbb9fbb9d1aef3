"""RecordWriter: atomic outputs, overwrite policy, resume after a killed run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import crc32c
import numpy as np
import pytest
from _recordio_util import MAGIC_LE, payload, write_rec

from stoker._core.errors import CorruptRecordError, OutputExistsError
from stoker.formats.recordio import RecordFile, RecordWriter, open_records, verify_records


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


# --------------------------------------------------------------------------- resume
def _killed_run(tmp_path, n_done, tail=b""):
    """Partials as a killed run leaves them: n_done records flushed, plus ``tail`` torn bytes."""
    ps = [payload(i, size=30 + i) for i in range(12)]
    rec = tmp_path / "r.rec"
    w = RecordWriter(rec, checksums=True)
    for i in range(n_done):
        w.write(i, ps[i])
    w.abort(keep_partial=True)
    with open(str(rec) + ".partial", "ab") as f:
        f.write(tail)
    return rec, ps


def _finish(rec, ps, *, kept=None):
    """Resume, write what is missing, then read it all back; ``kept``: the records the
    resume must have kept (``0..kept-1``)."""
    with RecordWriter(rec, resume=True, checksums=True) as w:
        done = set(w.keys_written.tolist())
        if kept is not None:
            assert w.keys_written.tolist() == list(range(kept))
        assert w.count == len(done)
        for i, p in enumerate(ps):
            if i not in done:
                w.write(i, p)
    with open_records(rec, verify_checksums=True) as r:
        assert [bytes(r.read(i)) for i in range(len(r))] == ps
    assert verify_records(rec).ok


def test_resume_keeps_complete_records(tmp_path):
    rec, ps = _killed_run(tmp_path, 5)
    with RecordWriter(rec, resume=True, checksums=True) as w:
        assert w.keys_written.tolist() == [0, 1, 2, 3, 4]
        assert w.bytes_written == os.path.getsize(str(rec) + ".partial")
        for i in range(5, 12):
            w.write(i, ps[i])
    with open_records(rec, verify_checksums=True) as r:
        assert [bytes(r.read(i)) for i in range(12)] == ps


@pytest.mark.parametrize("cut", [1, 7, 8, 9, 20])
def test_resume_truncates_a_torn_record(tmp_path, cut):
    frame = b"".join([MAGIC_LE, (40).to_bytes(4, "little"), b"z" * 40])
    rec, ps = _killed_run(tmp_path, 4, tail=frame[:cut])
    with RecordWriter(rec, resume=True, checksums=True) as w:
        assert w.count == 4
        assert os.path.getsize(str(rec) + ".partial") == w.bytes_written
        for i in range(4, 12):
            w.write(i, ps[i])
    with open_records(rec, verify_checksums=True) as r:
        assert [bytes(r.read(i)) for i in range(12)] == ps


def test_resume_drops_idx_line_without_its_record_and_record_without_line(tmp_path):
    rec, ps = _killed_run(tmp_path, 6)
    rec_p = str(rec) + ".partial"
    idx_p = str(rec)[:-4] + ".idx.partial"
    crc_p = str(rec)[:-4] + ".crc32c.partial"
    size = os.path.getsize(rec_p)
    # idx claims a 7th record the .rec never received; the crc file is one short as well
    with open(idx_p, "a") as f:
        f.write(f"6\t{size}\n7\t{size + 48}")  # second line torn (no newline)
    with open(crc_p, "r+b") as f:
        f.truncate(4 * 5)
    _finish(rec, ps, kept=6)
    # record written, idx line lost: the record is dropped and written again
    sub = tmp_path / "second"
    sub.mkdir()
    rec2, ps2 = _killed_run(sub, 6)
    idx2 = str(rec2)[:-4] + ".idx.partial"
    with open(idx2, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    with open(idx2, "wb") as f:
        f.write(b"".join(lines[:4]))
    _finish(rec2, ps2)


def test_resume_with_split_records(tmp_path):
    ps = [payload(i) + MAGIC_LE * (i % 3) for i in range(9)]
    rec = tmp_path / "s.rec"
    w = RecordWriter(rec, checksums=True)
    for i in range(7):
        w.write(i, ps[i])
    w.abort(keep_partial=True)
    rec_p = str(rec) + ".partial"
    with open(rec_p, "r+b") as f:
        f.truncate(os.path.getsize(rec_p) - 6)  # tear the last (split) record
    _finish(rec, ps, kept=6)


def test_resume_refuses_inconsistent_partials(tmp_path):
    rec, ps = _killed_run(tmp_path, 5)
    rec_p = str(rec) + ".partial"
    with open(rec_p, "r+b") as f:
        f.seek(0)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(CorruptRecordError, match="start over"):
        RecordWriter(rec, resume=True, checksums=True)
    # starting over (resume=False) is always possible
    with RecordWriter(rec, checksums=True) as w:
        assert w.count == 0
        for i, p in enumerate(ps):
            w.write(i, p)
    assert verify_records(rec).ok


def test_resume_without_partials_starts_fresh(tmp_path):
    with RecordWriter(tmp_path / "n.rec", resume=True) as w:
        assert w.count == 0 and w.keys_written.shape == (0,)
        w.write(3, b"abc")
    with RecordFile(tmp_path / "n.rec") as r:
        assert r.keys.tolist() == [3]


def test_resume_after_sigkill(tmp_path):
    """A real process killed mid-write: no final files; resume finishes the job."""
    rec = tmp_path / "k.rec"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from _recordio_util import payload
        from stoker.formats.recordio import RecordWriter
        w = RecordWriter({str(rec)!r}, checksums=True)
        for i in range(300):
            w.write(i, payload(i, size=500))
            if i == 200:
                w.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    assert not rec.exists() and not (tmp_path / "k.idx").exists()
    ps = [payload(i, size=500) for i in range(300)]
    with RecordWriter(rec, resume=True, checksums=True) as w:
        assert 0 < w.count <= 201
        assert w.keys_written.tolist() == list(range(w.count))
        for i in range(w.count, 300):
            w.write(i, ps[i])
    with open_records(rec, verify_checksums=True) as r:
        assert len(r) == 300 and all(bytes(r.read(i)) == ps[i] for i in range(300))
