"""Seeded mutation fuzz of .rec, .idx and .crc32c bytes (faults.md B3 #38).

Every mutation must give, for every position, the original payload or a StokerFormatError;
never another exception, a crash or a hang. ``verify_records`` must never raise on data.
100 mutations by default; ``-m slow`` runs 2,000.
"""

from __future__ import annotations

import random
import time

import pytest
from _recordio_util import MAGIC_LE, mutate

from stoker._core.errors import StokerFormatError
from stoker.formats.recordio import (
    IRHeader,
    RecordFile,
    RecordWriter,
    iter_records,
    pack_header,
    verify_records,
)


def _payloads():
    rng = random.Random(1234)
    out = []
    for i in range(14):
        body = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 90)))
        if i % 3 == 0:  # split records
            body = body[: (len(body) // 4) * 4] + MAGIC_LE + body + MAGIC_LE
        out.append(pack_header(IRHeader(0, [i, i + 0.5], i, 0), body))
    return out


def _one_case(d, originals, clean, seed):
    rng = random.Random(seed)
    target = rng.choice(["rec", "rec", "idx", "crc"])
    for name, blob in clean.items():
        data = mutate(blob, rng, text=name == "idx") if name == target else blob
        with open(d / f"f.{name if name != 'crc' else 'crc32c'}", "wb") as f:
            f.write(data)
    rec = d / "f.rec"
    start = time.monotonic()
    for checks in (True, False):
        try:
            r = RecordFile(rec, verify_checksums=checks, cache=False)
        except StokerFormatError:
            continue
        with r:
            if checks:  # the checksum file pins the record count (a cut .idx is caught)
                assert len(r) == len(originals)
            for i in range(len(r)):
                try:
                    got = bytes(r.read(i))
                except StokerFormatError:
                    continue
                if checks:  # checksummed reads give the original bytes or an error
                    assert got == originals[i], (seed, target, i)
                try:
                    r.read_header(i)
                except StokerFormatError:
                    pass
            try:
                r.labels()
            except StokerFormatError:
                pass
            except ValueError as e:  # a flip can make one record's label count differ
                assert "different label counts" in str(e)
    try:
        for _ in iter_records(rec):
            pass
    except StokerFormatError:
        pass
    rep = verify_records(rec)
    assert time.monotonic() - start < 2.0, f"seed {seed} took too long"
    return rep


def _setup(tmp_path):
    originals = _payloads()
    src = tmp_path / "src.rec"
    with RecordWriter(src, checksums=True) as w:
        for i, p in enumerate(originals):
            w.write(i, p)
    clean = {
        "rec": src.read_bytes(),
        "idx": (tmp_path / "src.idx").read_bytes(),
        "crc": (tmp_path / "src.crc32c").read_bytes(),
    }
    d = tmp_path / "m"
    d.mkdir()
    return d, originals, clean


def _run(tmp_path, seeds):
    d, originals, clean = _setup(tmp_path)
    flagged = 0
    for seed in seeds:
        rep = _one_case(d, originals, clean, seed)
        flagged += not rep.ok
    return flagged


def test_mutation_fuzz(tmp_path):
    flagged = _run(tmp_path, range(100))
    assert flagged > 50  # most mutations are visible to verify (the rest hit padding etc.)


@pytest.mark.slow
def test_mutation_fuzz_long(tmp_path):
    _run(tmp_path, range(1000, 3000))


def test_verify_sees_every_payload_change(tmp_path):
    """With checksums, verify flags every mutation that changed a payload's bytes."""
    d, originals, clean = _setup(tmp_path)
    for seed in range(60):
        rng = random.Random(seed)
        rec = bytearray(clean["rec"])
        pos = rng.randrange(len(rec))
        rec[pos] ^= 1 << rng.randrange(8)
        (d / "f.rec").write_bytes(bytes(rec))
        (d / "f.idx").write_bytes(clean["idx"])
        (d / "f.crc32c").write_bytes(clean["crc"])
        with RecordFile(d / "f.rec", cache=False) as r:
            changed = []
            for i in range(len(r)):
                try:
                    changed.append(bytes(r.read(i)) != originals[i])
                except StokerFormatError:
                    changed.append(True)
        assert verify_records(d / "f.rec").ok == (not any(changed)), seed
