"""Seeded random damage to an LMDB database (single-byte changes and truncations) read through
``verify``, ``stoker inspect`` and ``stoker.Loader`` in a child process per case. Outcomes are
counted: a clean error (a StokerError, a report naming the database, skipped records), silent
(finished, what was delivered differs: LMDB keeps no checksums, so damaged pixel bytes read as
other pixels), unchanged, a crash (the child died of a signal), a hang (no end within the
limit), or bad (another exception, or an error that does not name the database). Crashes,
hangs and bad outcomes must be 0.

A bounded sample (cases 0..2) runs by default; ``slow`` runs cases 5..204."""

from __future__ import annotations

import collections
import os
import random
import shutil

import pytest
from _lmdb_pages import tree
from test_lmdb_util import encode, lsun_key, photo, write_db

from damage_outcomes import run_child

SEED = 20261202
LIMIT = 60  # seconds a case may take before it counts as a hang


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> tuple[str, str]:
    items = []
    for i in range(160):
        img = photo(i % 30, 24, 32)
        items.append((lsun_key(i), encode(img, ".bmp" if i % 23 == 0 else ".jpg")))
    db = write_db(tmp_path_factory.mktemp("lmdb_fuzz") / "db", items)
    (loader,) = [d for d in _run(db, 0) if d["tool"] == "loader"]
    assert loader["outcome"] == "ok"
    return db, loader["detail"]  # the clean database and the digest of what it delivers


def _run(db: str, workers: int) -> list[dict]:
    return run_child(db, workers, LIMIT)


def _damage(data: str, rnd: random.Random) -> str:
    """One seeded change to ``data``: a truncation (1 case in 8) or one byte set to a random
    other value, at a uniform offset or where liblmdb's structure lives: a page header (flags,
    bounds), the node pointers, a node's header (sizes, flags, child page)."""
    size = os.path.getsize(data)
    if rnd.random() < 1 / 8:
        cut = rnd.randrange(size)
        os.truncate(data, cut)
        return f"truncate at {cut}"
    t = tree(data)
    page = rnd.choice([t.root, *t.branches, *t.leaves])
    where = rnd.choice(["anywhere", "meta page", "page header", "node pointers", "node header"])
    if where == "anywhere":
        at = rnd.randrange(size)
    elif where == "meta page":
        at = t.offset(rnd.randrange(2)) + rnd.randrange(16, 152)
    elif where == "page header":
        at = t.offset(page) + rnd.randrange(8, 16)  # flags, lower, upper (not the page number)
    elif where == "node pointers":
        at = t.offset(page) + rnd.randrange(16, t.lower[page])
    else:
        at = t.offset(page) + rnd.choice(t.nodes[page]) + rnd.randrange(8)
    with open(data, "r+b") as f:
        f.seek(at)
        old = f.read(1)[0]
        f.seek(at)
        f.write(bytes([(old + rnd.randrange(1, 256)) % 256]))
    return f"byte {at} ({where}, page {at // t.psize})"


def _fuzz(clean: tuple[str, str], tmp_path, cases: range, figures) -> collections.Counter:
    db0, digest = clean
    counts: collections.Counter = collections.Counter()
    failures = []
    for case in cases:
        rnd = random.Random(SEED * 100_003 + case)
        db = str(tmp_path / f"case{case}")
        shutil.copytree(db0, db)
        what = _damage(os.path.join(db, "data.mdb"), rnd)
        workers = 2 if case % 5 == 0 else 0
        for line in _run(db, workers):
            outcome = line["outcome"]
            if line["tool"] == "loader" and outcome == "ok":
                outcome = "unchanged" if line["detail"] == digest else "silent"
            counts[line["tool"], outcome] += 1
            if outcome in ("crash", "hang", "bad"):
                failures.append(f"case {case} ({what}, workers={workers}): {line}")
        shutil.rmtree(db)
    table = sorted(counts.items())
    print("\nLMDB fuzz outcomes:", ", ".join(f"{t}/{o}: {n}" for (t, o), n in table))
    worst = ("crash", "hang", "bad")
    failed = len({f.split(" (")[0] for f in failures})
    loader = {o: n for (t, o), n in counts.items() if t == "loader"}
    figures.add(  # F-14's LMDB row (tests/reliability/test_f14_outcomes.py has the others)
        "F-14 lmdb",
        tried=len(cases),
        ok=len(cases) - failed,
        note=f"seed {SEED}, cases {cases.start}..{cases.stop - 1}: "
        f"loader clean error {loader.get('error', 0)}, silent {loader.get('silent', 0)}, "
        f"unchanged {loader.get('unchanged', 0)}, "
        + ", ".join(f"{o} {sum(n for (_, oo), n in counts.items() if oo == o)}" for o in worst)
        + f", verify found {counts['verify', 'error']}",
    )
    assert not failures, "\n".join(failures)
    return counts


def test_random_damage_never_crashes_or_hangs_a_sample(clean, tmp_path, figures):
    counts = _fuzz(clean, tmp_path, range(3), figures)  # case 0 with workers=2
    assert sum(n for (tool, _), n in counts.items() if tool == "verify") == 3


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_random_damage_never_crashes_or_hangs(clean, tmp_path, figures):
    counts = _fuzz(clean, tmp_path, range(5, 205), figures)
    assert counts["verify", "error"] >= 20  # the damage is real: much of it is found
