"""F-14: seeded damage to a packed set of every format stoker writes, each case read through
``stoker verify --decode``, ``stoker inspect`` and ``stoker.Loader`` (``on_error="skip"``) in a
child process (``tests/_outcome_child.py``), and counted by how it ended:

- *clean error*: the Loader skipped and reported the sample (or raised a ``StokerError``)
  naming a file of the set;
- *silent*: the Loader finished without a word and delivered other pixels or labels than the
  clean set (must be 0: every format stoker writes checks what it delivers; LMDB, which has no
  checksums, is silent by design: see docs/reliability.md);
- *unchanged*: it delivered what the clean set delivers (the damage hit bytes nothing reads);
- *crash* (the child died of a signal), *hang* (no end within ``LIMIT``), *bad* (another
  exception, a traceback, or an error that names no file of the set).

Crashes, hangs and bad outcomes must be 0. The damage: one bit flipped at a uniform offset of
one of the set's data files (6 cases in 8), a 64-byte run zeroed (1 in 8), or the file cut
short (1 in 8). LMDB has its own run (``tests/formats/test_lmdb_pages_fuzz.py``), which
records its row of this figure too.

A bounded sample (case 0 of each format) runs by default; ``slow`` runs 40 per format."""

from __future__ import annotations

import collections
import os
import random
import shutil

import pytest

from damage_outcomes import run_child
from stoker.pack import make_sample_data, pack

SEED = 20261202
LIMIT = 60  # seconds a case may take before it counts as a hang
FORMATS = ("recordio", "tfrecord", "wds")
#: the files of a set that hold its records (the manifest has its own corpus in F-01)
DATA = {"recordio": (".rec", ".idx", ".crc32c"), "tfrecord": (".tfrecord",), "wds": (".tar",)}


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> dict[str, tuple[str, str]]:
    """Per format: the folder of a clean set of two shards and the digest it delivers."""
    root = tmp_path_factory.mktemp("f14")
    make_sample_data(root / "imgs", classes=2, per_class=8, size=32, seed=7)
    out = {}
    for fmt in FORMATS:
        folder = root / fmt
        folder.mkdir()
        pack(root / "imgs", folder / "set", format=fmt, shard_size=8, workers=1, progress=False)
        lines = _run(str(folder / "set.stoker.json"), 0)
        assert [d["outcome"] for d in lines] == ["ok", "ok", "ok"], lines
        out[fmt] = (str(folder), lines[-1]["detail"])
    return out


def _run(path: str, workers: int) -> list[dict]:
    return run_child(path, workers, LIMIT)


def _damage(folder: str, fmt: str, rnd: random.Random) -> str:
    """One seeded change to one data file of the set in ``folder``; what it was."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(DATA[fmt]))
    name = rnd.choice(names)
    path = os.path.join(folder, name)
    size = os.path.getsize(path)
    kind = rnd.randrange(8)
    if kind == 0:
        cut = rnd.randrange(size)
        os.truncate(path, cut)
        return f"{name} cut at {cut}"
    with open(path, "r+b") as f:
        if kind == 1:
            at = rnd.randrange(max(1, size - 64))
            f.seek(at)
            f.write(bytes(min(64, size - at)))
            return f"{name} 64 bytes zeroed at {at}"
        at, bit = rnd.randrange(size), rnd.randrange(8)
        f.seek(at)
        old = f.read(1)[0]
        f.seek(at)
        f.write(bytes([old ^ (1 << bit)]))
        return f"{name} bit {bit} of byte {at} flipped"


def _outcomes(clean, fmt: str, tmp_path, cases: range, figures) -> collections.Counter:
    folder0, digest = clean[fmt]
    counts: collections.Counter = collections.Counter()
    failures = []
    for case in cases:
        rnd = random.Random(SEED * 100_003 + case * 7 + FORMATS.index(fmt))
        folder = str(tmp_path / f"{fmt}-{case}")
        shutil.copytree(folder0, folder)
        what = _damage(folder, fmt, rnd)
        workers = 2 if case % 5 == 4 else 0
        lines = {d["tool"]: d for d in _run(os.path.join(folder, "set.stoker.json"), workers)}
        broken = [d for d in lines.values() if d["outcome"] in ("crash", "hang", "bad")]
        loader = lines.get("loader", {"outcome": "bad"})
        if broken:
            outcome = broken[0]["outcome"]
            failures.append(f"case {case} ({what}, workers={workers}): {broken[0]}")
        elif loader["outcome"] == "error":
            outcome = "clean error"
        else:
            outcome = "unchanged" if loader["detail"] == digest else "silent"
        counts[outcome] += 1
        counts["verify found"] += lines.get("verify", {}).get("outcome") == "error"
        shutil.rmtree(folder)
    n = len(cases)
    figures.add(
        f"F-14 {fmt}",
        tried=n,
        ok=n - sum(counts[k] for k in ("crash", "hang", "bad")),
        note=f"seed {SEED}, cases {cases.start}..{cases.stop - 1}: "
        + ", ".join(
            f"{k} {counts[k]}"
            for k in ("clean error", "silent", "unchanged", "crash", "hang", "bad", "verify found")
        ),
    )
    assert not failures, "\n".join(failures)
    return counts


@pytest.mark.parametrize("fmt", FORMATS)
def test_damage_never_crashes_or_hangs_a_sample(clean, tmp_path, fmt, figures):
    counts = _outcomes(clean, fmt, tmp_path, range(1), figures)
    assert sum(counts[k] for k in ("clean error", "silent", "unchanged")) == 1


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("fmt", FORMATS)
def test_damage_never_crashes_or_hangs(clean, tmp_path, fmt, figures):
    counts = _outcomes(clean, fmt, tmp_path, range(1, 41), figures)
    assert counts["clean error"] + counts["verify found"] >= 10  # the damage is real
    assert counts["silent"] == 0  # every byte the loader delivers of a stoker set is checked
