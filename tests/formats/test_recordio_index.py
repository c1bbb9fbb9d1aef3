"""The .idx parser (fast path and line-by-line fallback agree) and its binary cache, kept in
the cache directory (never beside the data)."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest
from _recordio_util import payload, write_rec
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker._core.errors import IndexFormatError
from stoker.formats.recordio import RecordFile, load_index, parse_idx
from stoker.formats.recordio.index import cache_path, fast_parse, slow_parse


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 10**17), st.integers(0, 10**12)), max_size=20),
    st.sampled_from(["\n", "\r\n"]),
    st.booleans(),
)
def test_fast_and_slow_parsers_agree(rows, eol, final_newline):
    text = eol.join(f"{k}\t{o}" for k, o in rows) + (eol if final_newline and rows else "")
    data = text.encode()
    fast = fast_parse(data)
    assert fast is not None
    keys, offs, _ = slow_parse(data, "x.idx")
    assert fast[0].tolist() == keys.tolist() == [k for k, _ in rows]
    assert fast[1].tolist() == offs.tolist() == [o for _, o in rows]


@pytest.mark.parametrize(
    "text",
    [b"1\t\n3\t4\n", b"1\t2\t3\n4\n", b"+1\t4\n", b"1\t4 \n", b"99999999999999999999\t4\n"],
)
def test_fast_path_declines_anything_unusual(text):
    assert fast_parse(text) is None


def test_big_numbers_are_refused_not_wrapped():
    with pytest.raises(IndexFormatError, match="too many digits"):
        parse_idx(b"0\t0\n99999999999999999999\t4\n", "x.idx")


def test_parse_reports_first_duplicate_in_file_order():
    with pytest.raises(IndexFormatError) as ei:
        parse_idx(b"5\t0\n3\t4\n3\t8\n5\t12\n", "x.idx")
    assert ei.value.line == 3 and "also on line 2" in ei.value.reason


def _age(path, seconds=60):
    """Make a file look older than the racy-mtime window so that it gets cached."""
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns - seconds * 10**9))


def _cache_header(path):
    with open(path, "rb") as f:
        return f.read(88)


def test_cache_is_written_used_and_rebuilt_when_stale(tmp_path):
    rec = write_rec(tmp_path, [payload(i) for i in range(30)])
    idx = rec[:-4] + ".idx"
    with RecordFile(rec) as r:
        keys = r.keys.tolist()
        offsets = r.offsets.tolist()
    assert not os.path.exists(cache_path(idx))  # a fresh .idx is not cached yet (racy mtime)
    _age(idx)
    cpath = cache_path(idx)
    with RecordFile(rec):
        pass
    assert os.path.exists(cpath) and _cache_header(cpath)[:8] == b"STKIDX\x00\x01"
    # the next open is served from the cache: alter a key in the cache only and see it
    n = 30
    with open(cpath, "r+b") as f:
        f.seek(88)
        f.write(struct.pack("<q", 1000))
    with RecordFile(rec) as r:
        assert r.keys[0] == 1000  # served from the cache
    # rewrite the .idx (new mtime/size): the cache is stale and rebuilt
    with open(idx, "w") as f:
        f.write("".join(f"{k + 100}\t{o}\n" for k, o in zip(keys, offsets)))
    _age(idx, 30)
    with RecordFile(rec) as r:
        assert r.keys.tolist() == [k + 100 for k in keys]
    with RecordFile(rec, cache=False) as r:
        assert r.keys.tolist() == [k + 100 for k in keys] and len(r) == n


@pytest.mark.parametrize("damage", ["truncate", "magic", "count", "garbage"])
def test_damaged_cache_is_ignored_and_rebuilt(tmp_path, damage):
    rec = write_rec(tmp_path, [payload(i) for i in range(10)])
    idx = rec[:-4] + ".idx"
    _age(idx)
    with RecordFile(rec) as r:
        want = (r.keys.tolist(), r.offsets.tolist())
    cpath = cache_path(idx)
    blob = bytearray(_read(cpath))
    if damage == "truncate":
        blob = blob[:-5]
    elif damage == "magic":
        blob[0] ^= 1
    elif damage == "count":
        blob[16:24] = struct.pack("<Q", 2**60)
    else:
        blob = bytearray(os.urandom(len(blob)))
    with open(cpath, "wb") as f:
        f.write(blob)
    with RecordFile(rec) as r:
        assert (r.keys.tolist(), r.offsets.tolist()) == want


def _read(p):
    with open(p, "rb") as f:
        return f.read()


def test_cache_follows_rec_size(tmp_path):
    """An offset valid for the old .rec size is re-checked when the .rec changes."""
    rec = write_rec(tmp_path, [payload(i, size=40) for i in range(3)])
    _age(rec[:-4] + ".idx")
    with RecordFile(rec):
        pass
    assert os.path.exists(cache_path(rec[:-4] + ".idx"))
    with open(rec, "r+b") as f:
        f.truncate(60)
    with pytest.raises(IndexFormatError, match="past the end"):
        RecordFile(rec)


def test_read_only_folder_runs_without_cache(tmp_path, monkeypatch):
    rec = write_rec(tmp_path, [payload(i) for i in range(5)])
    import tempfile

    def refuse(*a, **k):
        raise PermissionError("read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    _age(rec[:-4] + ".idx")
    with RecordFile(rec) as r:
        assert len(r) == 5
    assert not os.path.exists(cache_path(rec[:-4] + ".idx"))


def test_load_index_sha256_matches_file(tmp_path):
    import hashlib

    rec = write_rec(tmp_path, [payload(i) for i in range(5)])
    idx = rec[:-4] + ".idx"
    t = load_index(idx, rec_size=os.path.getsize(rec), cache=False, want_sha256=True)
    assert t.sha256 == hashlib.sha256(_read(idx)).hexdigest()
    _age(idx)
    t = load_index(idx, rec_size=os.path.getsize(rec))  # builds the cache
    t = load_index(idx, rec_size=os.path.getsize(rec), want_sha256=True)  # from the cache
    assert t.sha256 == hashlib.sha256(_read(idx)).hexdigest()
    assert isinstance(t.keys, np.ndarray) and t.keys.dtype == np.int64


def test_racy_idx_is_not_cached(tmp_path):
    """An .idx rewritten in place within one mtime tick must not be served from a cache."""
    rec = write_rec(tmp_path, [payload(i) for i in range(4)])
    idx = rec[:-4] + ".idx"
    with RecordFile(rec) as r:
        assert r.keys.tolist() == [0, 1, 2, 3]
    st = os.stat(idx)
    text = _read(idx).replace(b"3\t", b"7\t")
    with open(idx, "r+b") as f:
        f.write(text)
    os.utime(idx, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime
    with RecordFile(rec) as r:
        assert r.keys.tolist() == [0, 1, 2, 7]


def test_a_line_holding_only_a_tab_is_not_a_blank_line():
    with pytest.raises(IndexFormatError, match="line 2: empty key"):
        parse_idx(b"0\t0\n\t\n1\t8\n", "x.idx", rec_size=None)
    assert parse_idx(b"0\t0\n \r\n1\t8\n", "x.idx", rec_size=None).keys.tolist() == [0, 1]


def test_a_read_only_data_folder_gets_its_cache_elsewhere(tmp_path, monkeypatch):
    # nothing is ever written beside the data: the cache entries live in the cache directory
    data = tmp_path / "data"
    data.mkdir()
    rec = write_rec(data, [payload(i) for i in range(12)])
    _age(rec[:-4] + ".idx")
    _age(rec)
    before = sorted(os.listdir(data))
    os.chmod(data, 0o555)
    try:
        with RecordFile(rec) as r:
            want = (r.keys.tolist(), r.labels().tolist())
        assert sorted(os.listdir(data)) == before
        cpath = cache_path(rec[:-4] + ".idx")
        assert cpath is not None and cpath.startswith(str(tmp_path / "cache"))
        assert os.path.exists(cpath)
        assert os.listdir(tmp_path / "cache" / "recordio-labels")
        with RecordFile(rec) as r:  # served from the cache directory
            assert (r.keys.tolist(), r.labels().tolist()) == want
    finally:
        os.chmod(data, 0o755)
    # a cache directory that cannot be made: read without a cache, no error
    blocker = tmp_path / "not-a-folder"
    blocker.write_bytes(b"")
    monkeypatch.setenv("STOKER_CACHE_DIR", str(blocker / "cache"))
    assert cache_path(rec[:-4] + ".idx") is None
    with RecordFile(rec) as r:
        assert (r.keys.tolist(), r.labels().tolist()) == want
