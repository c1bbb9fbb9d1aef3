"""The loader checks each record's CRC32C (when the ``.crc32c`` side-car exists) and its
bounds against the next ``.idx`` offset, in the worker, on the fast per-sample path: a damaged
record is a ``CorruptRecordError`` naming key and offset, raised or skipped as ``on_error``
says."""

from __future__ import annotations

import gc
import os
import pickle
import random
import struct

import numpy as np
import pytest
from loader_helpers import jpeg_bytes

from stoker import Loader
from stoker._core.errors import CorruptRecordError, ManifestError
from stoker.formats.recordio import (
    IRHeader,
    RecordFile,
    RecordWriter,
    make_manifest,
    pack_header,
    write_manifest,
)
from stoker.loader.sources import RecordSource
from stoker.transforms import CenterCrop

N = 12
HEAD = 8 + 24  # dmlc part header + IRHeader


def _write(path, *, checksums: bool = True) -> list[int]:
    rng = np.random.default_rng(5)
    with RecordWriter(path, checksums=checksums) as w:
        for k in range(N):
            img = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
            w.write(k, pack_header(IRHeader(0, float(k % 3), k, 0), jpeg_bytes(img)))
    with RecordFile(path) as r:
        return [r.offset(i) for i in range(N)]


def _flip(path, byte: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(byte)
        b = f.read(1)[0]
        f.seek(byte)
        f.write(bytes([b ^ (1 << bit)]))


def _worker_read(state: bytes, i: int):
    """What a loader worker does for position ``i``: unpickle the source (reopening the
    files) and read through ``reader(indices)`` (the plain fast path where it applies)."""
    src = pickle.loads(state)
    try:
        return src.reader(np.arange(N))(i)
    finally:
        src.close()


def test_every_single_bit_flip_in_headers_and_images_is_caught(tmp_path):
    rec = str(tmp_path / "d.rec")
    offsets = _write(rec)
    size = os.path.getsize(rec)
    src = RecordSource(rec)
    state = pickle.dumps(src)  # the state a worker gets, taken from the clean files
    src.close()
    clean = [_worker_read(state, i) for i in range(N)]
    assert all(c is not None for c in clean)
    rng = random.Random(0)
    flips = 0
    for i in (0, 5, N - 1):
        off = offsets[i]
        end = offsets[i + 1] if i + 1 < N else size
        with open(rec, "rb") as f:
            _, lrec = struct.unpack_from("<II", f.read(), off)
        body = list(range(off + HEAD, off + 8 + (lrec & 0x1FFFFFFF)))
        where = [(b, bit) for b in range(off, off + HEAD) for bit in range(8)]
        where += [(b, rng.randrange(8)) for b in rng.sample(body, 40)]
        assert end >= off + HEAD
        for b, bit in where:
            _flip(rec, b, bit)
            try:
                with pytest.raises(CorruptRecordError) as e:
                    _worker_read(state, i)
                assert e.value.key == i and e.value.offset is not None, (b, bit)
                assert e.value.path == rec
            finally:
                _flip(rec, b, bit)
            flips += 1
    assert flips == 3 * (HEAD * 8 + 40)
    # the files are clean again: every record reads as before
    for i in range(N):
        _, label, key, _ = _worker_read(state, i)
        assert key == clean[i][2] and label == clean[i][1]
    # the caught errors' tracebacks hold the readers' frames in reference cycles: their
    # mapped index caches close when the cycle collector frees them, not before
    del e
    gc.collect()


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_skips_or_raises_records_whose_crc_does_not_match(tmp_path, workers):
    rec = str(tmp_path / "d.rec")
    offsets = _write(rec)
    for i in (2, 7):  # one bit of the image of records 2 and 7 (the JPEG may still decode)
        _flip(rec, offsets[i] + HEAD + 300, 3)
    kw = dict(batch_size=4, workers=workers, transforms=CenterCrop(8))
    with Loader(rec, on_error="skip", max_bad_fraction=0.5, **kw) as ld:
        keys = [int(k) for b in ld for k in b.keys]
        assert sorted(keys) == [k for k in range(N) if k not in (2, 7)]
        assert sorted(r["key"] for r in ld.rejects) == [2, 7]
        assert all("checksum mismatch" in r["reason"] for r in ld.rejects)
    with Loader(rec, **kw) as ld:
        with pytest.raises(CorruptRecordError, match=f"key 2, byte offset {offsets[2]}") as e:
            list(ld)
        assert e.value.key == 2 and "checksum mismatch" in str(e.value)
        assert (e.value.path, e.value.offset) == (rec, offsets[2])  # kept across the process
    # opting out: nothing checked (the flipped bit happens to decode)
    with Loader(RecordSource(rec, checksums=False), on_error="skip", **kw) as ld:
        [b.keys for b in ld]
        assert [r["key"] for r in ld.rejects if "checksum" in r["reason"]] == []


def test_loader_catches_a_length_that_overlaps_the_next_record_without_checksums(tmp_path):
    rec = str(tmp_path / "d.rec")
    offsets = _write(rec, checksums=False)
    with open(rec, "rb") as f:
        data = bytearray(f.read())
    (lrec,) = struct.unpack_from("<I", data, offsets[4] + 4)
    struct.pack_into("<I", data, offsets[4] + 4, lrec + 16)  # still inside the file
    with open(rec, "r+b") as f:
        f.write(bytes(data))
    kw = dict(batch_size=4, workers=2, on_error="skip", max_bad_fraction=0.5)
    with Loader(rec, transforms=CenterCrop(8), **kw) as ld:
        keys = [int(k) for b in ld for k in b.keys]
        assert 4 not in keys and len(keys) == N - 1
        assert [r["key"] for r in ld.rejects] == [4]
        assert "past the next record" in ld.rejects[0]["reason"]


def test_a_damaged_or_missing_side_car_is_an_error_at_open(tmp_path):
    rec = str(tmp_path / "d.rec")
    _write(rec)
    crc = rec[:-4] + ".crc32c"
    mpath = str(tmp_path / "d.stoker.json")
    with RecordFile(rec) as r:
        sha = r.idx_sha256
    entry = {
        "files": {"data": "d.rec", "index": "d.idx", "crc": "d.crc32c"},
        "records": N,
        "bytes": os.path.getsize(rec),
        "checksums": {"index.sha256": sha},
    }
    write_manifest(mpath, make_manifest([entry]))
    with open(crc, "rb") as f:
        whole = f.read()
    with open(crc, "wb") as f:
        f.write(whole[:-4])  # truncated: one record short
    for path in (rec, mpath):
        with pytest.raises((CorruptRecordError, ManifestError), match="d.crc32c"):
            RecordSource(path)
        RecordSource(path, checksums=False).close()  # the user's explicit opt-out
    os.remove(crc)
    with pytest.raises(ManifestError, match=r"d\.crc32c.*does not exist"):
        RecordSource(mpath)
    with pytest.raises(ManifestError, match="does not exist"):
        Loader(mpath, batch_size=4, workers=0, transforms=CenterCrop(8))
    RecordSource(mpath, checksums=False).close()
    with pytest.raises(ManifestError, match="does not exist"):
        RecordSource(rec)  # the manifest beside the .rec names the side-car
    os.remove(mpath)
    RecordSource(rec).close()  # a bare .rec without a side-car: nothing to check against
    with pytest.raises(TypeError):
        RecordSource(rec, checksums="yes")  # type: ignore[arg-type]


def test_a_set_without_records_is_an_error_naming_it(tmp_path):
    rec = tmp_path / "e.rec"
    rec.write_bytes(b"")
    with pytest.raises(CorruptRecordError, match=r"e\.rec: 0 records"):
        Loader(str(rec), batch_size=2, workers=0, transforms=CenterCrop(4))
    mpath = str(tmp_path / "e.stoker.json")
    write_manifest(mpath, make_manifest([]))
    with pytest.raises(ManifestError, match=r"e\.stoker\.json: 0 records"):
        RecordSource(mpath)
