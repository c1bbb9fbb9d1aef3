"""The ahead-of-order fetcher over a real ShardCache: downloads follow the plan, at most
`ahead` entries are held, the caller never waits, and background errors come out on close."""

from __future__ import annotations

import threading
import time

import pytest
from cache_helpers import LoggedFetch, crc_of, logged, payload, pinned

from stoker.storage import AheadFetcher, Item, ShardCache
from stoker.storage.cache import MARKER_RESERVE

SIZE = 16 * 1024


def items(log: str, n: int, *, delay: float = 0.0, prefix: str = "s") -> list[Item]:
    keys = [f"{prefix}{i}" for i in range(n)]
    return [
        Item(k, SIZE, crc_of(k, SIZE), f"shard {k}", LoggedFetch(k, SIZE, log, delay)) for k in keys
    ]


def held(root: str, plan: list[Item]) -> list[str]:
    return [it.key for it in plan if pinned(root, it.key)]


def until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class Failing:
    def __call__(self, out) -> None:
        out.write(b"x")
        raise ConnectionResetError("connection reset by the test")


@pytest.fixture
def log(tmp_path) -> str:
    return str(tmp_path / "downloads.log")


def test_follows_the_plan_and_holds_at_most_ahead(tmp_path, log):
    root = str(tmp_path / "cache")
    plan = items(log, 6, delay=0.01)
    most = 0
    stop = threading.Event()
    # A probe takes each entry's lock for an instant (LOCK_EX | LOCK_NB): two probes at once
    # would each see the other's as a held entry. The sampler and the waits below take turns.
    probe = threading.Lock()

    def held_now() -> list[str]:
        with probe:
            return held(root, plan)

    def sample() -> None:  # entries held (pinned or being downloaded) at any moment
        nonlocal most
        while not stop.is_set():
            # under the fetcher's lock, which every pin release and every choice of the next
            # download takes: one scan sees one state, not the halves of two
            with fetcher._cond:
                most = max(most, len(held_now()))
            time.sleep(0.001)

    fetcher = AheadFetcher(ShardCache(root, 2**20), ahead=2)
    fetcher.plan(plan)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        until(lambda: held_now() == ["s0", "s1"] and len(logged(log)) == 2)
        for i in range(1, 7):
            fetcher.reached(i)
            want, count = [it.key for it in plan[i : i + 2]], min(i + 2, 6)
            until(lambda w=want, n=count: held_now() == w and len(logged(log)) == n)
    finally:
        stop.set()
        sampler.join()
        fetcher.close()
    assert logged(log) == [it.key for it in plan]  # one download each, in plan order
    assert most <= 2
    assert held(root, plan) == []


def test_reached_never_waits_for_a_download(tmp_path, log):
    cache = ShardCache(tmp_path / "cache", 2**20)
    fetcher = AheadFetcher(cache, ahead=2)
    plan = items(log, 4, delay=0.5)
    start = time.monotonic()
    fetcher.plan(plan)
    until(lambda: logged(log) == ["s0"])  # a download is under way
    for i in range(5):
        fetcher.reached(i)
    assert time.monotonic() - start < 0.4
    fetcher.close()  # waits for the download in progress, starts no other
    assert logged(log) == ["s0"]
    assert held(cache.root, plan) == []


def test_background_errors_are_kept_and_raised_by_close(tmp_path, log):
    cache = ShardCache(tmp_path / "cache", 2**20)
    plan = items(log, 3)
    plan[1] = Item("bad", SIZE, None, "shard bad", Failing())
    fetcher = AheadFetcher(cache, ahead=3)
    fetcher.plan(plan)
    until(lambda: len(logged(log)) == 2 and fetcher.errors)
    until(lambda: held(cache.root, plan) == ["s0", "s2"])  # the other items still come
    assert [type(e) for e in fetcher.errors] == [ConnectionResetError]
    with pytest.raises(ConnectionResetError, match="reset by the test"):
        fetcher.close()
    assert held(cache.root, plan) == []
    fetcher.close()  # raised once


def test_waits_for_room_and_goes_on_when_the_reader_moves(tmp_path, log):
    """A cache with room for two: the third item waits (without blocking anyone) until the
    reader is done with the first."""
    cache = ShardCache(tmp_path / "cache", 2 * (SIZE + MARKER_RESERVE), wait=60)
    plan = items(log, 4)
    with AheadFetcher(cache, ahead=3) as fetcher:
        fetcher.plan(plan)
        until(lambda: held(cache.root, plan) == ["s0", "s1"])
        time.sleep(0.3)
        assert logged(log) == ["s0", "s1"]
        fetcher.reached(1)
        until(lambda: held(cache.root, plan) == ["s1", "s2"])
        start = time.monotonic()
    assert time.monotonic() - start < 0.5  # close() did not wait out the retry for room
    assert logged(log) == ["s0", "s1", "s2"]
    with cache.get("s1", size=SIZE, crc32c=crc_of("s1", SIZE), fetch=Failing()) as pin:
        with open(pin.path, "rb") as f:  # what the fetcher downloaded is what the reader reads
            assert f.read() == payload("s1", SIZE)


def test_retries_when_another_reader_lets_go(tmp_path, log):
    """Room held by another reader's pin comes back without any call on the fetcher."""
    cache = ShardCache(tmp_path / "cache", 2 * (SIZE + MARKER_RESERVE), wait=60)
    other = cache.get("x", size=SIZE, crc32c=None, fetch=LoggedFetch("x", SIZE, log))
    plan = items(log, 2)
    with AheadFetcher(cache, ahead=2) as fetcher:
        fetcher.plan(plan)
        until(lambda: held(cache.root, plan) == ["s0"])
        time.sleep(0.2)
        other.close()
        until(lambda: held(cache.root, plan) == ["s0", "s1"])
    assert logged(log) == ["x", "s0", "s1"]


def test_a_new_plan_replaces_the_old_one(tmp_path, log):
    cache = ShardCache(tmp_path / "cache", 2**20)
    first, second = items(log, 3, prefix="a"), items(log, 3, prefix="b")
    with AheadFetcher(cache, ahead=2) as fetcher:
        fetcher.plan(first)
        until(lambda: held(cache.root, first) == ["a0", "a1"])
        fetcher.plan(second)
        until(lambda: held(cache.root, second) == ["b0", "b1"])
        assert held(cache.root, first) == []


def test_bad_arguments(tmp_path):
    cache = ShardCache(tmp_path / "cache", 2**20)
    with pytest.raises(ValueError, match="ahead"):
        AheadFetcher(cache, ahead=-1)
    fetcher = AheadFetcher(cache)
    with pytest.raises(TypeError, match="Item"):
        fetcher.plan(["s0"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="reached"):
        fetcher.reached(-1)
    fetcher.close()
    with pytest.raises(RuntimeError, match="after close"):
        fetcher.plan([])


class Gate:
    """A fetch that waits until ``n`` fetches are running at once (or a timeout), and records
    the most that ran together."""

    def __init__(self, key: str, state: dict) -> None:
        self.key, self.state = key, state

    def __call__(self, out) -> None:
        st = self.state
        with st["lock"]:
            st["running"] += 1
            st["most"] = max(st["most"], st["running"])
        st["all_in"].wait(timeout=5)  # the barrier breaks when fewer than n run at once
        out.write(payload(self.key, SIZE))
        with st["lock"]:
            st["running"] -= 1


@pytest.mark.parametrize("threads", [1, 3])
def test_threads_download_that_many_at_once_within_the_window(tmp_path, threads):
    st = {"lock": threading.Lock(), "running": 0, "most": 0}
    st["all_in"] = threading.Barrier(threads)
    plan = [
        Item(f"g{i}", SIZE, crc_of(f"g{i}", SIZE), f"g{i}", Gate(f"g{i}", st)) for i in range(6)
    ]
    with AheadFetcher(ShardCache(str(tmp_path / "c"), 2**20), ahead=3, threads=threads) as f:
        f.plan(plan)
        until(lambda: all(pinned(str(tmp_path / "c"), it.key) for it in plan[:3]))
        f.reached(3)
        until(lambda: all(pinned(str(tmp_path / "c"), it.key) for it in plan[3:]))
    assert st["most"] == threads


def test_shards_ahead_start_after_the_shards_already_handed_out(tmp_path, log):
    """A loader's downloads ahead (``ShardsAhead``, 4 shards of 10 positions read in order,
    ``ahead=2``): once position 5 is handed out, shard 0 is the workers' and the two shards
    downloaded ahead are 1 and 2; once every position is handed out, none is held ahead."""
    import numpy as np

    from stoker.formats.shardfiles import ShardsAhead

    root = str(tmp_path / "cache")
    plan = items(log, 4)
    starts, order = np.array([0, 10, 20, 30, 40]), np.arange(40)
    cache = ShardCache(root, 2**20)
    ahead = ShardsAhead(cache, lambda j: [plan[j]], order, starts, 0, ahead=2, per=1)
    try:
        until(lambda: held(root, plan) == ["s0", "s1"])
        ahead.reached(5)
        until(lambda: held(root, plan) == ["s1", "s2"])
        ahead.reached(40)
        until(lambda: held(root, plan) == [])
    finally:
        ahead.close()
