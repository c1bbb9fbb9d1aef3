"""``RecordFile.plain_reader``: the loader's per-sample fast path. Wherever it answers, it
must give exactly what ``read_header`` and ``key`` give; everything else (split records,
several labels, damage, checksums, a shrunk file) it must leave to ``read_header``."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import numpy as np
import pytest
from _recordio_util import MAGIC_LE, face_set, mutate, payload, write_rec

from stoker._core.errors import CorruptRecordError, StokerFormatError
from stoker.formats.recordio import IRHeader, RecordFile, pack_header
from stoker.formats.recordio.seam import RecordIOReader
from stoker.formats.recordio.shard import RAW


def _mixed_payloads() -> list[bytes]:
    """One-label records, multi-label ones, split ones (a magic word inside) and empty images."""
    out = []
    for i in range(24):
        p = payload(i, size=(i * 7) % 50, labels=0 if i % 4 else 2)
        if i % 5 == 0:
            p = pack_header(IRHeader(0, float(i), i, 0), b"\x01\x02\x03\x04" + MAGIC_LE + b"xy")
        out.append(p)
    return out


def _agrees(r: RecordFile, plain, i: int) -> bool:
    """True when plain answered for ``i`` (and then it matched read_header and key)."""
    got = plain(i)
    if got is None:
        return False
    label, image, key = got
    header, want = r.read_header(i)  # must not raise where plain answered
    assert header.flag == 0 and struct.pack("<f", header.label) == struct.pack("<f", label)
    assert bytes(image) == bytes(want)
    assert key == r.key(i)
    return True


def test_plain_reader_matches_read_header_and_leaves_the_rest(tmp_path):
    ps = _mixed_payloads()
    rec = write_rec(tmp_path, ps, keys=[1000 + 3 * j for j in range(len(ps))], checksums=False)
    with RecordFile(rec) as r:
        plain = r.plain_reader()
        assert plain is not None
        answered = [i for i in range(len(r)) if _agrees(r, plain, i)]
        # every one-label single-part record is served; split and multi-label ones are not
        expected = [i for i in range(len(ps)) if i % 4 and i % 5]
        assert answered == expected
        for i in (-1, -len(r), len(r), 10**9):  # no wrap-around: out of range is not served
            assert plain(i) is None
        # told the positions about to be read (a loader's chunk; repeats and out-of-range
        # ones included), it answers the same for those and for every other position
        told = r.plain_reader([7, 3, 3, 11, -1, len(r), 10**9, 1])
        assert told is not None
        assert [i for i in range(len(r)) if _agrees(r, told, i)] == expected
        for i in (-1, -len(r), len(r), 10**9):
            assert told(i) is None


def test_plain_reader_checks_crc32c_and_is_off_on_a_shrunk_file(tmp_path):
    ps = [payload(i, size=3000) for i in range(6)]
    rec = write_rec(tmp_path, ps, checksums=True)
    data = bytearray(Path(rec).read_bytes())
    with RecordFile(rec) as r:
        off = r.offset(4)
    data[off + 8 + 24 + 1000] ^= 0x10  # one bit of record 4's image
    Path(rec).write_bytes(bytes(data))
    for told in (None, [4, 2]):
        with RecordFile(rec, verify_checksums=True) as r:
            plain = r.plain_reader(told)
            assert plain is not None  # the fast path stays on with checksums
            assert all(_agrees(r, plain, i) for i in (0, 1, 2, 3, 5))
            assert plain(4) is None  # left to read_header, which names the problem
            with pytest.raises(CorruptRecordError, match="checksum mismatch") as e:
                r.read_header(4)
            assert e.value.key == 4 and e.value.offset == off
    with RecordFile(rec, verify_checksums="auto") as r:  # the side-car exists: checked
        assert r.plain_reader()(4) is None
    with RecordFile(rec) as r:  # checksums off
        assert r.plain_reader()(4) is not None
        with open(rec, "r+b") as f:
            f.truncate(100)
        assert r.plain_reader() is None  # pages past the end would SIGBUS: none is touched


def test_a_length_that_overlaps_the_next_record_is_caught_without_checksums(tmp_path):
    ps = [payload(i, size=40) for i in range(5)]
    rec = write_rec(tmp_path, ps, checksums=False)
    with RecordFile(rec) as r:
        off = r.offset(1)
    data = bytearray(Path(rec).read_bytes())
    (lrec,) = struct.unpack_from("<I", data, off + 4)
    struct.pack_into("<I", data, off + 4, lrec + 8)  # record 1 now swallows record 2's head
    Path(rec).write_bytes(bytes(data))
    with RecordFile(rec) as r:
        for told in (None, [1]):
            plain = r.plain_reader(told)
            assert plain(1) is None and _agrees(r, plain, 0) and _agrees(r, plain, 2)
        with pytest.raises(CorruptRecordError, match="past the next record") as e:
            r.read_header(1)
        assert e.value.key == 1 and e.value.offset == off and e.value.idx_line == 2


def _fuzz(tmp_path, seeds, *, checksums: bool = False) -> int:
    originals = [payload(i, size=(i * 13) % 70) for i in range(16)]
    clean_rec = write_rec(tmp_path, originals, checksums=checksums)
    names = ("rec", "idx", "crc32c") if checksums else ("rec", "idx")
    clean = {name: Path(clean_rec[:-4] + "." + name).read_bytes() for name in names}
    d = tmp_path / "m"
    d.mkdir()
    served = 0
    for seed in seeds:
        rng = random.Random(seed)
        target = rng.choice(["rec", "rec", "rec", "idx"])  # the .crc32c stays intact
        for name, blob in clean.items():
            data = mutate(blob, rng, text=name == "idx") if name == target else blob
            (d / f"f.{name}").write_bytes(data)
        try:
            r = RecordFile(d / "f.rec", cache=False, verify_checksums=checksums)
        except StokerFormatError:
            continue
        with r:
            plain = r.plain_reader()
            assert plain is not None
            served += sum(_agrees(r, plain, i) for i in range(len(r)))
    return served


def test_plain_reader_agrees_with_read_header_on_damaged_files(tmp_path):
    assert _fuzz(tmp_path, range(150)) > 1000  # most records of most mutants are still served


def test_plain_reader_agrees_with_read_header_on_damaged_files_with_checksums(tmp_path):
    assert _fuzz(tmp_path, range(150), checksums=True) > 1000


@pytest.mark.slow
def test_plain_reader_agrees_with_read_header_on_damaged_files_long(tmp_path):
    _fuzz(tmp_path, range(150, 3000))


def test_plain_reader_of_an_insightface_sets_images(tmp_path):
    # MS1M-style sets are read through their image view: positions 0..M-1 of the view
    rec = tmp_path / "faces.rec"
    face_set(rec, per_identity=(2, 3))
    with RecordIOReader(rec) as r:
        sh, n = r.shard(0), len(r)
        f = sh._file()
        for told in (None, [n - 1, 0, 0, n, -1]):  # told a chunk's positions, or not
            get = sh._samples(None if told is None else np.array(told), (), RAW)
            for i in range(n):
                image, label, key, _ = get(i)
                header, want = f.read_header(sh._at(i))
                assert (label, bytes(image), key) == (header.label, bytes(want), r.key(i))
            with pytest.raises(IndexError):
                get(n)
