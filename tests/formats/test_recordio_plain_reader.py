"""``RecordFile.plain_reader``: the loader's per-sample fast path. Wherever it answers, it
must give exactly what ``read_header`` and ``key`` give; everything else (split records,
several labels, damage, checksums, a shrunk file) it must leave to ``read_header``."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
from _recordio_util import MAGIC_LE, face_set, mutate, payload, write_rec

from stoker._core.errors import StokerFormatError
from stoker.formats.recordio import IRHeader, RecordFile, pack_header


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


def test_plain_reader_is_off_with_checksums_and_on_a_shrunk_file(tmp_path):
    ps = [payload(i, size=3000) for i in range(6)]
    rec = write_rec(tmp_path, ps, checksums=True)
    with RecordFile(rec, verify_checksums=True) as r:
        assert r.plain_reader() is None  # each read must be checked: read_header does it
    with RecordFile(rec) as r:
        assert r.plain_reader() is not None
        with open(rec, "r+b") as f:
            f.truncate(100)
        assert r.plain_reader() is None  # pages past the end would SIGBUS: none is touched


def _fuzz(tmp_path, seeds) -> int:
    originals = [payload(i, size=(i * 13) % 70) for i in range(16)]
    clean_rec = write_rec(tmp_path, originals, checksums=False)
    clean = {name: Path(clean_rec[:-4] + "." + name).read_bytes() for name in ("rec", "idx")}
    d = tmp_path / "m"
    d.mkdir()
    served = 0
    for seed in seeds:
        rng = random.Random(seed)
        target = rng.choice(["rec", "rec", "rec", "idx"])
        for name, blob in clean.items():
            data = mutate(blob, rng, text=name == "idx") if name == target else blob
            (d / f"f.{name}").write_bytes(data)
        try:
            r = RecordFile(d / "f.rec", cache=False)
        except StokerFormatError:
            continue
        with r:
            plain = r.plain_reader()
            assert plain is not None
            served += sum(_agrees(r, plain, i) for i in range(len(r)))
    return served


def test_plain_reader_agrees_with_read_header_on_damaged_files(tmp_path):
    assert _fuzz(tmp_path, range(150)) > 1000  # most records of most mutants are still served


@pytest.mark.slow
def test_plain_reader_agrees_with_read_header_on_damaged_files_long(tmp_path):
    _fuzz(tmp_path, range(150, 3000))


def test_plain_reader_of_an_insightface_sets_images(tmp_path):
    # MS1M-style sets are read through their image view: positions 0..M-1 of the view
    rec = tmp_path / "faces.rec"
    face_set(rec, per_identity=(2, 3))
    with RecordFile(rec) as r:
        images = r.images()
        n = len(images)
        for told in (None, [n - 1, 0, 0, n, -1]):  # told a chunk's positions, or not
            plain = images.plain_reader(told)
            assert plain is not None
            for i in range(n):
                label, image, key = plain(i)
                header, want = images.read_header(i)
                assert (label, bytes(image), key) == (header.label, bytes(want), images.key(i))
            assert plain(n) is None and plain(-1) is None
