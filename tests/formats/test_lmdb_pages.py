"""Damaged LMDB pages: a truncated ``data.mdb``, zeroed or scribbled B-tree pages and bad meta
pages give an error naming the file, never the death of the reading process (liblmdb faults
with SIGBUS past the end of the file and aborts on its IS_LEAF/IS_BRANCH assertions).

Each damaged database is read in child processes, as a user would: ``stoker verify`` and
``stoker inspect`` through the CLI (exit 1 and a line naming the file, not 134/135), and
``stoker.Loader`` with ``workers=0`` and ``workers=2``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from _lmdb_pages import Tree, patch, tree
from test_lmdb_util import encode, lsun_key, photo, raw_datum, write_db

import stoker.formats
from stoker._core.errors import CorruptRecordError
from stoker.formats.lmdb import guard, verify

HERE = os.path.dirname(os.path.abspath(__file__))
N = 600  # 2 records a leaf, 3 levels: a root, branches under it, leaves
TIMEOUT = 120


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[str, Tree]:
    items = []
    for i in range(N):
        img = photo(i % 40, 24, 32)
        # every 37th value is a BMP (2,358 bytes): too big for a leaf, it gets overflow pages
        items.append((lsun_key(i), encode(img, ".bmp" if i % 37 == 0 else ".jpg")))
    db = write_db(tmp_path_factory.mktemp("lmdb") / "db", items)
    t = tree(os.path.join(db, "data.mdb"))
    assert len(t.branches) >= 3 and t.root in t.branches and t.overflow
    return db, t


def _copy(base: tuple[str, Tree], tmp_path) -> tuple[str, str, Tree]:
    db = str(tmp_path / "db")
    shutil.copytree(base[0], db)
    return db, os.path.join(db, "data.mdb"), base[1]


def _zero(data: str, t: Tree, pgno: int) -> None:
    patch(data, t.offset(pgno), bytes(t.psize))


def _meta_field(data: str, t: Tree, at: int, value: bytes) -> None:
    patch(data, t.offset(t.meta) + at, value)


#: name -> (damage(data, tree), what the message says)
CASES = {
    "truncated to half": (
        lambda d, t: os.truncate(d, os.path.getsize(d) // 2),
        r"truncated: meta page \d counts \d+ pages of 4096 bytes",
    ),
    "truncated inside the last page": (
        lambda d, t: os.truncate(d, os.path.getsize(d) - 100),
        r"truncated",
    ),
    "truncated inside meta page 1": (
        lambda d, t: os.truncate(d, t.psize + 100),
        r"the file ends \(4196 bytes\) inside meta page 1",
    ),
    "truncated inside meta page 0": (
        lambda d, t: os.truncate(d, 100),
        r"not a readable LMDB database: 100 bytes, shorter than a meta page",
    ),
    "zeroed root page": (lambda d, t: _zero(d, t, t.root), r"damaged LMDB pages"),
    "zeroed leaf page": (
        lambda d, t: _zero(d, t, t.leaves[len(t.leaves) // 2]),
        r"liblmdb crashed \(SIGABRT: mdb\.c:\d+: Assertion 'IS_LEAF",
    ),
    "zeroed branch page": (
        lambda d, t: _zero(d, t, [b for b in t.branches if b != t.root][1]),
        r"liblmdb crashed \(SIGABRT: mdb\.c:\d+: Assertion 'IS_BRANCH",
    ),
    "zeroed leaf and branch pages": (
        lambda d, t: [_zero(d, t, p) for p in (t.leaves[5], t.leaves[-5], t.branches[-1])],
        r"damaged LMDB pages",
    ),
    "scribbled leaf header": (
        lambda d, t: patch(d, t.offset(t.leaves[100]) + 8, bytes.fromhex("ff7f3399")),
        r"damaged LMDB pages",
    ),
    "scribbled branch header": (
        lambda d, t: patch(d, t.offset(t.branches[2]) + 8, bytes.fromhex("0000ffff01f0")),
        r"damaged LMDB pages",
    ),
    "leaf page claims a node more": (
        lambda d, t: patch(
            d, t.offset(t.leaves[50]) + 12, (t.lower[t.leaves[50]] + 2).to_bytes(2, "little")
        ),
        r"damaged LMDB pages",
    ),
    "meta page: root past the last page": (
        lambda d, t: _meta_field(d, t, 128, (t.last_pg + 7).to_bytes(8, "little")),
        r"meta page \d puts the root page at \d+, outside pages 2\.\.\d+",
    ),
    "meta page: page size": (
        lambda d, t: patch(d, 40, (4095).to_bytes(4, "little")),
        r"meta page 0 gives a page size of 4095",
    ),
    "meta page: data version": (
        lambda d, t: _meta_field(d, t, 20, (7).to_bytes(4, "little")),
        r"has data version 7",
    ),
    "meta page: last page beyond the file": (
        lambda d, t: _meta_field(d, t, 136, (t.last_pg * 4).to_bytes(8, "little")),
        r"truncated",
    ),
    "meta page: last page zero": (
        lambda d, t: _meta_field(d, t, 136, bytes(8)),
        r"meta page \d gives 0 as the last page",
    ),
    "meta page in use zeroed": (
        lambda d, t: _zero(d, t, t.meta),
        r"meta page \d is not an LMDB meta page|byte 0 does not start an LMDB meta page",
    ),
}
#: the cases also read through the Loader (every case runs through both CLI commands)
LOADED = {
    "truncated to half",
    "zeroed leaf page",
    "zeroed branch page",
    "meta page: root past the last page",
}
#: the cases of the default run (each kind of damage once); the others run under ``slow``
QUICK = {
    *LOADED,
    "truncated inside meta page 1",
    "zeroed root page",
    "scribbled leaf header",
    "leaf page claims a node more",
    "meta page in use zeroed",
}


def _cli(*argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "stoker.cli", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)


def _loads(db: str, on_error: str = "raise") -> list[dict]:
    cmd = [sys.executable, os.path.join(HERE, "_lmdb_load_child.py"), db, on_error]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"the loader's process died ({r.returncode}): {r.stderr[-800:]}"
    return [json.loads(line) for line in r.stdout.splitlines()]


@pytest.mark.parametrize(
    "case", [c if c in QUICK else pytest.param(c, marks=pytest.mark.slow) for c in CASES]
)
def test_damaged_pages_give_an_error_naming_the_file(base, tmp_path, case):
    db, data, t = _copy(base, tmp_path)
    damage, says = CASES[case]
    damage(data, t)

    r = _cli("verify", db)
    assert r.returncode == 1, f"stoker verify exited {r.returncode}: {r.stderr[-800:]}"
    assert "Traceback" not in r.stderr
    problems = [line for line in r.stdout.splitlines() if line.startswith(f"problem: {db}")]
    assert any(re.search(says, line) for line in problems), r.stdout

    r = _cli("inspect", db)
    assert r.returncode == 1, f"stoker inspect exited {r.returncode}: {r.stderr[-800:]}"
    (line,) = r.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith(f"stoker inspect: error: {db}")
    assert re.search(says, line), line

    if case in LOADED:
        for run in _loads(db):
            assert run.get("stoker") is True, run
            assert run["message"].startswith(db) and re.search(says, run["message"])


# ------------------------------------------------------------- liblmdb errors while reading


def _damage_in_place(data: str, t: Tree, pgno: int) -> None:
    """Zero page ``pgno`` keeping the file's size and modification time: the cached verdict and
    key list still apply, so the readers meet the damage themselves (liblmdb answers lookups in
    a zeroed leaf with MDB_CORRUPTED)."""
    st = os.stat(data)
    _zero(data, t, pgno)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))


def _leaf_positions(db: str, t: Tree, leaf: int) -> list[int]:
    with stoker.formats.open(db) as r:
        order = [r.lmdb_key(i) for i in range(len(r))]
    return sorted(order.index(k) for k in t.keys[leaf])


def test_a_liblmdb_error_names_the_file_and_key_and_the_next_record_still_reads(base, tmp_path):
    db, data, t = _copy(base, tmp_path)
    leaf = t.leaves[len(t.leaves) // 3]
    bad = _leaf_positions(db, t, leaf)
    with stoker.formats.open(db) as r:
        f = r.reader()
        assert all(f(i)[0][:2] in (b"\xff\xd8", b"BM") for i in range(N))
        _damage_in_place(data, t, leaf)  # under the open reader's map
        for i in range(N):
            if i not in bad:
                assert f(i)[0][:2] in (b"\xff\xd8", b"BM")  # a fresh transaction after each error
                continue
            with pytest.raises(CorruptRecordError) as info:
                f(i)
            e = info.value
            assert (e.path, e.key) == (data, i)
            assert str(e).startswith(f"{data}, key {i}: LMDB key '{r.lmdb_key(i).decode()}'")
            assert "MDB_CORRUPTED" in str(e)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_the_loader_reports_liblmdb_errors_as_corrupt_records(base, tmp_path, on_error):
    db, data, t = _copy(base, tmp_path)
    leaf = t.leaves[len(t.leaves) // 2]
    bad = _leaf_positions(db, t, leaf)  # the open caches the verdict and the key list
    _damage_in_place(data, t, leaf)
    for run in _loads(db, on_error):
        if on_error == "raise":
            assert run["stoker"] and run["error"].endswith("CorruptRecordError"), run
            assert f"{data}, key {bad[0]}: LMDB key" in run["message"]
        else:
            assert sorted(run["indices"]) == [i for i in range(N) if i not in bad], run
            assert [i for i, _ in run["rejects"]] == bad
            assert all(
                why.startswith(f"CorruptRecordError: {data}, key ") for _, why in run["rejects"]
            )


# ------------------------------------------------------------------ the cached verdict


def _entries(kind: str) -> list[str]:
    folder = os.path.join(os.environ["STOKER_CACHE_DIR"], kind)
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_the_walk_runs_once_per_file_state_and_its_verdict_is_cached(base, tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    db, data, t = _copy(base, tmp_path)
    walks = []
    real = guard._walk

    def counted(loc):
        walks.append(loc.path)
        return real(loc)

    monkeypatch.setattr(guard, "_walk", counted)
    stoker.formats.open(db).close()
    assert len(walks) == 1 and len(_entries("lmdb-check")) == 1
    guard._SEEN.clear()  # as in a new process: the verdict comes from the cache directory
    stoker.formats.open(db).close()
    assert verify(db).ok and len(walks) == 1

    # a stale or foreign entry (another transaction id) is not trusted: the file is walked again
    (entry,) = _entries("lmdb-check")
    path = os.path.join(tmp_path / "cache", "lmdb-check", entry)
    with open(path) as f:
        d = json.load(f)
    d["txnid"] += 1
    with open(path, "w") as f:
        json.dump(d, f)
    guard._SEEN.clear()
    stoker.formats.open(db).close()
    assert len(walks) == 2

    # damage changes the file's identity: walked again, refused, and the refusal is cached too
    _zero(data, t, t.leaves[7])
    for _ in range(2):
        guard._SEEN.clear()
        with pytest.raises(CorruptRecordError, match="IS_LEAF") as info:
            stoker.formats.open(db)
        assert info.value.path == data
    assert len(walks) == 3 and len(_entries("lmdb-check")) == 2


def test_a_walk_that_does_not_finish_is_refused_and_not_cached(base, tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(guard, "walk_timeout", lambda size: 0.001)
    db, data, _ = _copy(base, tmp_path)
    with pytest.raises(CorruptRecordError, match=r"did not finish within 0 s") as info:
        stoker.formats.open(db)
    assert info.value.path == data
    assert _entries("lmdb-check") == [] and all(k[0] != data for k in guard._SEEN)


def test_a_damaged_branch_key_fails_only_the_records_under_it(base, tmp_path):
    """A branch page's separator key changed: the cursor still lists every record, but lookups
    of the keys under that branch entry go to its neighbour and find nothing. The check lets
    the database open (nothing crashes); ``verify`` names exactly the records that a read
    fails on, and the Loader skips exactly those."""
    db, data, t = _copy(base, tmp_path)
    branch = next(b for b in t.branches if b != t.root)
    node = t.nodes[branch][2]  # its third entry: the key is the lower bound of that child
    patch(data, t.offset(branch) + node + 8, b"\xff")  # now above every key under it
    with stoker.formats.open(db) as r:
        f, bad = r.reader(), []
        for i in range(N):
            try:
                f(i)
            except stoker.formats.lmdb.LmdbFormatError as e:
                assert "a lookup does not find it" in str(e)
                bad.append(i)
    assert 0 < len(bad) < N // 2
    report = verify(db)
    assert [p.key for p in report.problems] == bad
    assert all("a lookup does not find it" in p.reason for p in report.problems)
    (w0, w2) = _loads(db, "skip")
    assert [i for i, _ in w0["rejects"]] == bad and sorted(w2["indices"]) == sorted(
        set(range(N)) - set(bad)
    )


def test_a_first_key_that_a_lookup_misses_is_an_error_at_open(base, tmp_path):
    db, data, t = _copy(base, tmp_path)
    patch(data, t.offset(t.root) + t.nodes[t.root][1] + 8, b"\x00")  # below every key
    with pytest.raises(stoker.formats.lmdb.LmdbFormatError, match=r"position 0: the cursor lists"):
        stoker.formats.open(db)  # the layout is read from the first value
    with stoker.formats.open(db, layout="image") as r:
        assert len(r) == N


def test_liblmdb_errors_in_a_cursor_pass_name_the_file_and_position(base, tmp_path):
    """The key list and a Datum database's labels are cursor passes: liblmdb's error there (the
    first leaf zeroed after the check; liblmdb answers MDB_CORRUPTED) is a CorruptRecordError
    naming the file and the position reached."""
    db, data, t = _copy(base, tmp_path)
    stoker.formats.open(db).close()  # the verdict is cached
    keys = os.path.join(os.environ["STOKER_CACHE_DIR"], "lmdb-keys")
    for name in os.listdir(keys):  # the key list is not: it is built again, by a cursor pass
        os.unlink(os.path.join(keys, name))
    _damage_in_place(data, t, t.leaves[0])
    with pytest.raises(CorruptRecordError, match=r"key 0: liblmdb: .*MDB_CORRUPTED") as info:
        stoker.formats.open(db)
    assert info.value.path == data

    items = [(b"%04d" % i, raw_datum(photo(i, 4, 4), i % 7)) for i in range(300)]
    db = write_db(tmp_path / "datum", items)
    data = os.path.join(db, "data.mdb")
    t = tree(data)
    assert len(t.leaves) > 2
    with stoker.formats.open(db, layout="datum") as r:
        _damage_in_place(data, t, t.leaves[0])  # the keys are listed; the labels are not
        with pytest.raises(CorruptRecordError, match=r"key 0: liblmdb: .*MDB_CORRUPTED") as info:
            r.labels()
    assert info.value.path == data


@pytest.mark.parametrize(
    ("dies", "cached"), [("os.abort()", True), ("os.kill(os.getpid(), signal.SIGKILL)", False)]
)
def test_only_a_fault_of_the_walk_is_a_verdict(base, tmp_path, monkeypatch, dies, cached):
    """The walk dying of SIGABRT (liblmdb's assertions; SIGBUS and SIGSEGV alike) is the file's
    fault and is cached; a SIGKILL from outside (the OOM killer) says nothing about the file."""
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    db, data, _ = _copy(base, tmp_path)
    script = tmp_path / "dies.py"
    script.write_text(f"import os, signal\n{dies}\n")
    monkeypatch.setattr(guard, "_SCRIPT", str(script))
    want = CorruptRecordError if cached else OSError
    with pytest.raises(want, match="SIGABRT" if cached else "SIGKILL.*nothing is cached"):
        stoker.formats.open(db)
    assert len(_entries("lmdb-check")) == int(cached)
    monkeypatch.undo()
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    guard._SEEN.clear()
    if cached:
        with pytest.raises(CorruptRecordError, match="SIGABRT"):
            stoker.formats.open(db)
    else:
        stoker.formats.open(db).close()
