"""The node-wide shard cache with real processes, real files and real flocks: one download per
key across processes, a budget that holds at every instant, pins that block eviction, and
damaged, stale, killed and disk-full cases that never hand out wrong bytes."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import multiprocessing
import os
import pickle
import signal
import stat
import subprocess
import threading
import time
import warnings

import pytest
from cache_helpers import (
    LoggedFetch,
    churn_main,
    crc_of,
    du,
    hang_main,
    hold_pin_main,
    logged,
    payload,
    pinned,
    reader_main,
    touch,
    wait_for,
)

from stoker import CacheFullError, CorruptRecordError, StorageError
from stoker._core.errors import size_text
from stoker.storage import ShardCache
from stoker.storage.cache import MARKER_RESERVE

SPAWN = multiprocessing.get_context("spawn")
SIZE = 32 * 1024


def get(cache: ShardCache, key: str, log: str, size: int = SIZE, **kw):
    fetch = LoggedFetch(key, size, log, **kw)
    return cache.get(key, size=size, crc32c=crc_of(key, size), fetch=fetch, name=f"shard {key}")


def read(pin) -> bytes:
    with open(pin.path, "rb") as f:
        return f.read()


def run_processes(target, argsets, *, go: str | None = None, timeout: float = 60.0) -> None:
    """Start one spawned process per argument tuple (creating ``go`` once all are started) and
    wait for them; each must exit 0."""
    procs = [SPAWN.Process(target=target, args=args) for args in argsets]
    for p in procs:
        p.start()
    if go is not None:
        touch(go)
    codes = []
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
        codes.append(p.exitcode)
        p.close()
    assert codes == [0] * len(procs)


@pytest.fixture
def log(tmp_path) -> str:
    return str(tmp_path / "downloads.log")


def test_one_download_per_key_two_ranks_two_workers(tmp_path, log):
    """4 processes (2 ranks x 2 workers) get the same 6 keys in their own random orders:
    each key is downloaded exactly once and every process reads the same bytes."""
    root = str(tmp_path / "cache")
    keys = [f"shard-{i}" for i in range(6)]
    go = str(tmp_path / "go")
    outs = [str(tmp_path / f"seen-{r}-{w}.json") for r in range(2) for w in range(2)]
    run_processes(
        reader_main,
        [(root, 10 * 2**20, keys, SIZE, log, out, seed, go) for seed, out in enumerate(outs)],
        go=go,
    )
    assert sorted(logged(log)) == keys  # one download per key on the node
    expected = {k: hashlib.sha256(payload(k, SIZE)).hexdigest() for k in keys}
    for out in outs:
        with open(out) as f:
            assert json.load(f) == expected


def test_threads_share_one_download(tmp_path, log):
    cache = ShardCache(tmp_path / "cache", 2**20)
    got: list[bytes] = []

    def one() -> None:
        with get(cache, "k", log, delay=0.05) as pin:
            got.append(read(pin))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert logged(log) == ["k"]
    assert got == [payload("k", SIZE)] * 6


def test_budget_is_never_exceeded(tmp_path, log):
    """Two processes churn through 12 objects with room for 3: a sampler polling the bytes of
    every file under the cache folder (the .part files of downloads in progress included)
    never sees more than the budget."""
    root = str(tmp_path / "cache")
    size = 64 * 1024
    limit = 3 * (size + MARKER_RESERVE)
    keys = [f"k{i}" for i in range(12)]
    peak = 0
    stop = threading.Event()

    def sample() -> None:  # under the cache lock, so no file is seen both before and after
        nonlocal peak  # an eviction or a rename; downloads keep writing meanwhile
        while not os.path.exists(os.path.join(root, "lock")):
            if stop.wait(0.001):
                return
        fd = os.open(os.path.join(root, "lock"), os.O_RDWR)
        try:
            while not stop.is_set():
                fcntl.flock(fd, fcntl.LOCK_EX)
                peak = max(peak, du(root))
                fcntl.flock(fd, fcntl.LOCK_UN)
                time.sleep(0.0005)
        finally:
            os.close(fd)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        run_processes(churn_main, [(root, limit, keys, size, log, 60, seed) for seed in (1, 2)])
    finally:
        stop.set()
        sampler.join()
    assert peak <= limit, f"the cache held {peak} bytes with a budget of {limit}"
    assert peak > 2 * size  # the sampler saw the cache near full
    assert len(logged(log)) > len(keys)  # entries were evicted and fetched again
    assert ShardCache(root, limit).usage() <= limit


def test_pinned_entry_is_kept_and_unpinned_one_evicted(tmp_path, log):
    limit = 2 * (SIZE + MARKER_RESERVE)
    cache = ShardCache(tmp_path / "cache", limit)
    a = get(cache, "a", log)
    get(cache, "b", log).close()
    with get(cache, "c", log) as c:  # needs room: b goes, a is pinned
        assert read(c) == payload("c", SIZE)
    assert read(a) == payload("a", SIZE)
    a.close()
    get(cache, "a", log).close()
    get(cache, "b", log).close()
    assert logged(log) == ["a", "b", "c", "b"]  # a stayed cached; b came back


def test_least_recently_used_goes_first(tmp_path, log):
    cache = ShardCache(tmp_path / "cache", 2 * (SIZE + MARKER_RESERVE))
    get(cache, "a", log).close()
    time.sleep(0.01)
    get(cache, "b", log).close()
    time.sleep(0.01)
    get(cache, "a", log).close()  # a hit: a is now the more recently used
    time.sleep(0.01)
    get(cache, "c", log).close()
    get(cache, "a", log).close()
    assert logged(log) == ["a", "b", "c"]


def test_pin_in_another_process_blocks_eviction(tmp_path, log):
    root = str(tmp_path / "cache")
    limit = SIZE + MARKER_RESERVE
    ready, release = str(tmp_path / "ready"), str(tmp_path / "release")
    holder = SPAWN.Process(target=hold_pin_main, args=(root, limit, "a", SIZE, log, ready, release))
    holder.start()
    try:
        wait_for(ready)
        cache = ShardCache(root, limit, wait=0.3)
        with pytest.raises(CacheFullError, match="shard a"):
            get(cache, "b", log)
        assert pinned(root, "a")
    finally:
        touch(release)
        holder.join(30)
    assert holder.exitcode == 0
    holder.close()
    with get(ShardCache(root, limit), "b", log) as b:  # the pin went with the process
        assert read(b) == payload("b", SIZE)


def test_a_forked_child_does_not_keep_its_parents_pins(tmp_path, log):
    """A flock lives while any copy of its descriptor is open: a child forked while the parent
    holds a pin must not keep the entry pinned after the parent lets go."""
    cache = ShardCache(tmp_path / "cache", 2**20)
    pin = get(cache, "a", log)
    ready_r, ready_w = os.pipe()
    stop_r, stop_w = os.pipe()
    with warnings.catch_warnings():  # the child only writes and reads pipes, then exits
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: say it runs (after the fork handlers), then wait for stop
        try:
            os.close(stop_w)
            os.write(ready_w, b"r")
            os.read(stop_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(stop_r)
    try:
        assert os.read(ready_r, 1) == b"r"
        assert pinned(cache.root, "a")
        pin.close()
        assert not pinned(cache.root, "a")
    finally:
        os.close(stop_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def test_no_room_waits_then_names_budget_and_pins(tmp_path, log):
    limit = 2 * (SIZE + MARKER_RESERVE)
    cache = ShardCache(tmp_path / "cache", limit, wait=0.4)
    with get(cache, "a", log), get(cache, "b", log):
        start = time.monotonic()
        with pytest.raises(CacheFullError) as info:
            get(cache, "c", log)
        waited = time.monotonic() - start
        assert cache.try_get("c", size=SIZE, crc32c=None, fetch=LoggedFetch("c", SIZE, log)) is None
    assert 0.4 <= waited < 5
    text = str(info.value)
    assert f"budget is {size_text(limit)}" in text
    assert "shard a" in text and "shard b" in text and "shard c" in text
    assert "c" not in logged(log)  # nothing was downloaded past the budget


def test_object_larger_than_budget_fails_at_once(tmp_path, log):
    cache = ShardCache(tmp_path / "cache", SIZE, wait=60)
    start = time.monotonic()
    with pytest.raises(CacheFullError, match=f"at least {size_text(SIZE + MARKER_RESERVE)}"):
        get(cache, "big", log)
    assert time.monotonic() - start < 1
    assert logged(log) == []


def _flip_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))


def _truncate(path: str) -> None:
    os.truncate(path, SIZE - 1)


def _flip_keep_mtime_drop_marker(path: str) -> None:
    st = os.stat(path)
    _flip_byte(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.unlink(path[: -len(".data")] + ".ok")


@pytest.mark.parametrize("damage", [_flip_byte, _truncate, _flip_keep_mtime_drop_marker])
def test_damaged_cached_file_is_fetched_again(tmp_path, log, damage):
    cache = ShardCache(tmp_path / "cache", 2**20)
    with get(cache, "a", log) as pin:
        path = pin.path
    damage(path)
    with get(cache, "a", log) as pin:
        assert read(pin) == payload("a", SIZE)
    assert logged(log) == ["a", "a"]


def test_damaged_file_still_pinned_is_an_error_not_a_hang(tmp_path, log):
    """A pinned copy that went bad cannot be replaced under its reader: after ``wait`` the
    get fails naming the file, instead of waiting forever on its own process's pin."""
    cache = ShardCache(tmp_path / "cache", 2**20, wait=0.3)
    with get(cache, "a", log) as pin:
        _truncate(pin.path)
        with pytest.raises(StorageError, match=f"shard a \\({pin.path}\\).*still pins it"):
            get(cache, "a", log)
    with get(cache, "a", log) as again:
        assert read(again) == payload("a", SIZE)
    assert logged(log) == ["a", "a"]


@pytest.mark.parametrize("short", [False, True])
def test_bad_download_is_fetched_once_more(tmp_path, log, short):
    cache = ShardCache(tmp_path / "cache", 2**20)
    with get(cache, "a", log, bad=1, short=short) as pin:
        assert read(pin) == payload("a", SIZE)
    assert logged(log) == ["a", "a"]


def test_bad_download_twice_is_corrupt_record_error(tmp_path, log):
    root = tmp_path / "cache"
    cache = ShardCache(root, 2**20)
    with pytest.raises(CorruptRecordError, match="shard a.*CRC32C") as info:
        get(cache, "a", log, bad=2)
    assert "shard a" in str(info.value) and str(root) in str(info.value)
    assert logged(log) == ["a", "a"]
    assert os.listdir(root / "entries") == [] and os.listdir(root / "tmp") == []
    assert cache.usage() == 0


def test_stale_temporary_files_are_ignored_and_removed(tmp_path, log):
    """Downloads a killed process left behind hold no budget and are never read: one of
    another key (removed by the next accounting pass) and one of the key itself."""
    root = tmp_path / "cache"
    limit = SIZE + MARKER_RESERVE
    cache = ShardCache(root, limit, wait=0.5)
    os.makedirs(root / "tmp")
    for key in ("a", "b"):  # right size, wrong bytes, each reserving the whole budget
        (root / "tmp" / f"{key}.{limit}.999999.0badf00d.part").write_bytes(b"\0" * SIZE)
    (root / "tmp" / "b.999999.0badf00d.mark").write_bytes(b"{}")
    assert cache.usage() >= 2 * limit
    with get(cache, "a", log) as pin:
        assert read(pin) == payload("a", SIZE)
    assert os.listdir(root / "tmp") == []
    assert logged(log) == ["a"]


def test_sigkill_mid_download_leaves_nothing_read(tmp_path, log):
    root = str(tmp_path / "cache")
    limit = 2 * (SIZE + MARKER_RESERVE)
    ready = str(tmp_path / "ready")
    proc = SPAWN.Process(target=hang_main, args=(root, limit, "a", SIZE, ready))
    proc.start()
    try:
        wait_for(ready)
        assert pinned(root, "a")  # the download holds the entry
        assert len(os.listdir(os.path.join(root, "tmp"))) == 1
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(30)
    assert proc.exitcode == -signal.SIGKILL
    proc.close()
    cache = ShardCache(root, limit, wait=0.5)
    with get(cache, "a", log) as pin:
        assert read(pin) == payload("a", SIZE)
    assert logged(log) == ["a"]  # fetched again, the half-written file never read
    assert os.listdir(os.path.join(root, "tmp")) == []


def test_enospc_from_the_fetch_is_cache_full_error(tmp_path):
    root = tmp_path / "cache"
    cache = ShardCache(root, 2**20)

    def fetch(out) -> None:
        out.write(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(
        CacheFullError, match=f"no space left on the disk of the shard cache {root}"
    ):
        cache.get("a", size=SIZE, crc32c=None, fetch=fetch, name="shard a")
    assert os.listdir(root / "tmp") == []


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a small tmpfs here ({proc.stderr.strip()}); ENOSPC is "
            "covered through the fetch by test_enospc_from_the_fetch_is_cache_full_error"
        )
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_cache_full_error(small_disk, log):
    """A budget larger than the disk: the reservation fails before any byte is fetched."""
    cache = ShardCache(small_disk / "cache", 2**30, wait=60)
    with get(cache, "a", log, size=128 * 1024) as pin:  # fits
        assert read(pin) == payload("a", 128 * 1024)
    start = time.monotonic()
    with pytest.raises(CacheFullError, match="no space left on the disk"):
        get(cache, "b", log, size=192 * 1024)
    assert time.monotonic() - start < 2
    assert logged(log) == ["a"]
    assert os.listdir(small_disk / "cache" / "tmp") == []


def test_files_are_private(tmp_path, log):
    root = tmp_path / "cache"
    with get(ShardCache(root, 2**20), "a", log):
        pass
    for folder, _, names in os.walk(root):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
        for name in names:
            path = os.path.join(folder, name)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    assert sorted(os.listdir(root)) == ["entries", "lock", "locks", "tmp"]


@pytest.mark.parametrize("key", ["", ".", "..", "../x", "a/b", "a b", "x" * 201, "é", "a\0"])
def test_bad_keys_are_refused(tmp_path, key):
    cache = ShardCache(tmp_path / "cache", 2**20)
    with pytest.raises(ValueError, match="cache key"):
        cache.get(key, size=1, crc32c=None, fetch=lambda out: out.write(b"x"))
    assert not (tmp_path / "x").exists()


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(ValueError, match="limit"):
        ShardCache(tmp_path, 0)
    with pytest.raises(ValueError, match="wait"):
        ShardCache(tmp_path, 10, wait=-1)
    cache = ShardCache(tmp_path, 2**20)
    with pytest.raises(ValueError, match="size"):
        cache.get("a", size=-1, crc32c=None, fetch=lambda out: None)
    with pytest.raises(ValueError, match="crc32c"):
        cache.get("a", size=1, crc32c=2**32, fetch=lambda out: None)


def test_pickles_root_limit_and_wait_and_has_a_default(tmp_path, monkeypatch):
    cache = ShardCache(tmp_path / "c", 12345, wait=7)
    back = pickle.loads(pickle.dumps(cache))
    assert (back.root, back.limit, back.wait) == (str(tmp_path / "c"), 12345, 7.0)
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "home"))
    default = ShardCache()
    assert default.root == str(tmp_path / "home" / "shards")
    st = os.statvfs(tmp_path)
    assert 0 < default.limit <= min(100 * 2**30, st.f_bavail * st.f_frsize)


def test_clear_keeps_pinned_entries(tmp_path, log):
    cache = ShardCache(tmp_path / "cache", 2**20)
    with get(cache, "a", log) as a:
        get(cache, "b", log).close()
        assert cache.usage() >= 2 * SIZE
        cache.clear()
        assert read(a) == payload("a", SIZE)
        assert SIZE <= cache.usage() < 2 * SIZE
    cache.clear()
    assert cache.usage() == 0
