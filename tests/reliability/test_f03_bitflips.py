"""F-03: single-bit flips in a record are detected with checksums on (faults.md rows 27, 33).

Flips cover every bit of one record's header (the 8-byte RecordIO part header and the 24-byte
IRHeader) and a seeded sample of its image bits (every image bit in the slow run). Each flipped
file must be caught by ``verify_records(checksums=True)`` naming that record, and by
``stoker.Loader(path, workers=0, on_error="skip")``, which must skip exactly that record (or
raise a ``StokerFormatError`` naming it).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from _reliability_util import load_corpus_module

SEED = 20261201
FRAMING_BITS = range(0, 64)
IRHEADER_BITS = range(64, 64 + 192)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    mfc = load_corpus_module()
    folder = tmp_path_factory.mktemp("f03-base")
    mfc.write_set(folder, mfc.base_payloads(), manifest=False)
    offsets = mfc.record_offsets(folder)
    key = mfc.PLAIN_KEY
    return folder, key, offsets[key], offsets[key + 1] - offsets[key]


def _flipped(base, tmp: Path, bit: int) -> Path:
    folder, key, off, _span = base
    work = tmp / f"bit{bit}"
    shutil.copytree(folder, work)
    rec = work / "ds.rec"
    data = bytearray(rec.read_bytes())
    data[off + bit // 8] ^= 1 << (bit % 8)
    rec.write_bytes(bytes(data))
    return rec


def _payload_bits(base, n: int | None) -> list[int]:
    _folder, _key, _off, span = base
    bits = list(range((8 + 24) * 8, span * 8))  # the image bytes and the padding after them
    if n is None or n >= len(bits):
        return bits
    return sorted(random.Random(SEED).sample(bits, n))


def _verify_detects(base, rec: Path, *, exact: bool) -> str | None:
    from stoker.formats.recordio import verify_records

    _folder, key, off, _span = base
    report = verify_records(rec, checksums=True, progress=False)
    if report.ok:
        return "verify found nothing"
    ours = [p for p in report.problems if p.key == key or p.offset == off]
    if not ours:
        return f"no problem names key {key}: {[str(p) for p in report.problems][:3]}"
    if exact and len(ours) != len(report.problems):
        return f"other records flagged too: {[str(p) for p in report.problems][:3]}"
    return None


def _loader_detects(base, rec: Path) -> str | None:
    import stoker
    from stoker._core.errors import StokerFormatError
    from stoker.transforms import Resize

    _folder, key, off, _span = base
    try:
        with stoker.Loader(
            str(rec),
            batch_size=2,
            transforms=Resize(16),
            workers=0,
            on_error="skip",
            max_bad_fraction=1.0,
        ) as loader:
            got = sorted(int(k) for batch in loader for k in batch.keys)
    except StokerFormatError as e:
        return None if (f"key {key}" in str(e) or f"offset {off}" in str(e)) else str(e)[:200]
    want = [k for k in range(load_corpus_module().N_RECORDS) if k != key]
    return None if got == want else f"delivered keys {got}, expected {want}"


def _run(figures, name: str, base, tmp: Path, bits, check) -> None:
    missed = []
    for bit in bits:
        why = check(base, _flipped(base, tmp, bit))
        if why is not None:
            missed.append(f"bit {bit}: {why}")
    figures.add(name, tried=len(bits), ok=len(bits) - len(missed), note=f"seed {SEED}")
    assert not missed, f"{len(missed)}/{len(bits)} flips missed: {missed[:5]}"


def test_verify_header_bits(base, tmp_path, figures):
    bits = list(FRAMING_BITS) + list(IRHEADER_BITS)
    _run(
        figures,
        "F-03 verify: header bits",
        base,
        tmp_path,
        bits,
        lambda b, r: _verify_detects(b, r, exact=False),
    )


@pytest.mark.parametrize(
    "n", [pytest.param(128, id="sample"), pytest.param(None, id="all", marks=pytest.mark.slow)]
)
def test_verify_payload_bits(base, tmp_path, figures, n):
    _run(
        figures,
        "F-03 verify: payload bits",
        base,
        tmp_path,
        _payload_bits(base, n),
        lambda b, r: _verify_detects(b, r, exact=True),
    )


@pytest.mark.parametrize(
    "n", [pytest.param(16, id="sample"), pytest.param(None, id="all", marks=pytest.mark.slow)]
)
def test_loader_header_bits(base, tmp_path, figures, n):
    bits = list(FRAMING_BITS) + list(IRHEADER_BITS)
    if n is not None:
        bits = sorted(random.Random(SEED).sample(bits, n * 4))
    _run(figures, "F-03 loader: header bits", base, tmp_path, bits, _loader_detects)


@pytest.mark.parametrize(
    "n", [pytest.param(32, id="sample"), pytest.param(512, id="large", marks=pytest.mark.slow)]
)
def test_loader_payload_bits(base, tmp_path, figures, n):
    _run(
        figures,
        "F-03 loader: payload bits",
        base,
        tmp_path,
        _payload_bits(base, n),
        _loader_detects,
    )
