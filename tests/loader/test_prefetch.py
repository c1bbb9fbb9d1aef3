"""stoker.prefetch: a background thread that stops when the consumer stops."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time
import traceback

import numpy as np
import pytest

from stoker.loader.prefetch import Prefetcher, prefetch


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "stoker-prefetch" and t.is_alive()]


def _wait_no_threads(timeout: float = 5.0) -> list[threading.Thread]:
    deadline = time.monotonic() + timeout
    while _prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    return _prefetch_threads()


@pytest.fixture(autouse=True)
def _no_prefetch_threads():
    assert _prefetch_threads() == []
    yield
    if _wait_no_threads(timeout=0.5):  # one a dropped prefetcher's cycle still holds
        gc.collect()
    assert _wait_no_threads() == [], "a prefetch thread outlived its test"


def test_exported_as_stoker_prefetch():
    import stoker

    assert stoker.prefetch is prefetch


def test_yields_every_item_in_order():
    assert list(prefetch(range(100), depth=3)) == list(range(100))


def test_empty_iterable_yields_nothing():
    assert list(prefetch([], depth=1)) == []


def test_runs_ahead_in_another_thread_bounded_by_depth():
    produced: list[int] = []
    where: set[str] = set()

    def gen():
        for i in range(50):
            where.add(threading.current_thread().name)
            produced.append(i)
            yield i

    with prefetch(gen(), depth=2) as it:
        assert next(it) == 0
        time.sleep(0.2)  # let the producer fill the queue
        # consumer holds 0; queue holds 2; the producer may hold one more waiting to be put
        assert 1 + 2 <= len(produced) <= 1 + 2 + 1
    assert where == {"stoker-prefetch"}


def test_break_stops_the_thread_and_closes_the_source():
    closed = threading.Event()

    def gen():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            closed.set()

    source = gen()  # kept referenced here: only an explicit close() runs its finally
    for i in prefetch(source, depth=2):
        if i == 3:
            break
    gc.collect()
    assert _wait_no_threads() == []
    assert closed.is_set(), "the source generator was not closed"


def test_close_while_the_producer_is_blocked_on_a_full_queue():
    p = prefetch(iter(range(10**9)), depth=1)
    assert next(p) == 0
    time.sleep(0.1)  # producer now waits in put()
    assert p.alive
    p.close()
    assert not p.alive
    with pytest.raises(StopIteration):
        next(p)
    p.close()  # idempotent


def test_dropping_an_unstarted_prefetcher_stops_its_thread():
    p = prefetch(iter(range(10**9)), depth=4)
    time.sleep(0.05)
    del p
    gc.collect()
    assert _wait_no_threads() == []


def test_exception_propagates_with_the_source_traceback_and_stops_the_thread():
    def failing_source():
        yield 1
        yield 2
        raise KeyError("record 42 is missing")

    got = []
    with pytest.raises(KeyError, match="record 42") as info:
        for x in prefetch(failing_source(), depth=2):
            got.append(x)
    assert got == [1, 2]
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "failing_source" in frames
    assert _wait_no_threads() == []


def test_exception_from_iter_itself_propagates():
    class Broken:
        def __iter__(self):
            raise OSError("cannot open shard")

    with pytest.raises(OSError, match="cannot open shard"):
        list(prefetch(Broken()))


def test_consumer_exception_inside_with_block_stops_the_thread():
    with pytest.raises(RuntimeError, match="step failed"):
        with prefetch(iter(range(10**9)), depth=2) as it:
            for i in it:
                if i == 5:
                    raise RuntimeError("step failed")
    assert _wait_no_threads() == []


def test_generator_wrapping_a_prefetcher_is_closed():
    def wrapper():
        yield from prefetch(iter(range(10**9)), depth=2)

    w = wrapper()
    assert [next(w) for _ in range(3)] == [0, 1, 2]
    w.close()
    gc.collect()
    assert _wait_no_threads() == []


class SlotItem:
    """A batch following the loader's slot protocol: valid until the next request, unless
    retained. The source scribbles on a slot as soon as it is free again."""

    def __init__(self, ring: SlotRing, slot: int, value: int) -> None:
        self.ring, self.slot, self.value = ring, slot, value
        self.retained = False

    def retain(self):
        self.retained = True
        return self

    def release(self):
        assert self.retained, "release() without retain()"
        self.retained = False
        self.ring.free(self)

    def read(self) -> int:
        return self.ring.data[self.slot]


class SlotRing:
    def __init__(self, n_items: int, slots: int) -> None:
        self.n_items, self.slots = n_items, slots
        self.data = [-1] * slots
        self.free_slots = list(range(slots))

    def free(self, item: SlotItem) -> None:
        self.data[item.slot] = -999  # the worker refills it at once
        self.free_slots.append(item.slot)

    def __iter__(self):
        prev = None
        for i in range(self.n_items):
            if prev is not None and not prev.retained:
                self.free(prev)
            if not self.free_slots:
                raise RuntimeError("ring exhausted: every slot is held")
            slot = self.free_slots.pop(0)
            self.data[slot] = i
            prev = SlotItem(self, slot, i)
            yield prev
        if prev is not None and not prev.retained:
            self.free(prev)


def test_slot_batches_stay_valid_until_the_next_request():
    ring = SlotRing(n_items=40, slots=5)
    seen = []
    for item in prefetch(ring, depth=2):
        time.sleep(0.001)  # the producer races ahead meanwhile
        seen.append(item.read())
    assert seen == list(range(40))
    assert sorted(ring.free_slots) == list(range(5)), "a slot was never released"


def test_slot_batches_released_when_consumer_breaks():
    ring = SlotRing(n_items=1000, slots=5)
    for item in prefetch(ring, depth=2):
        assert item.read() == item.value
        if item.value == 7:
            break
    gc.collect()
    assert _wait_no_threads() == []
    assert sorted(ring.free_slots) == list(range(5))


def test_depth_beyond_the_loader_ring_is_refused_up_front(arrays):
    from stoker.loader import Loader

    x, y = arrays
    with Loader((x[:0], y[:0]), batch_size=4, prefetch=2, workers=0) as ld:
        assert ld.slots == 4
        with pytest.raises(ValueError, match="use depth <= 2 or a loader with prefetch >= 3"):
            prefetch(ld, depth=3)
        assert list(prefetch(ld, depth=2)) == []


def test_bad_depth_is_a_clear_error():
    with pytest.raises(ValueError, match="depth must be >= 1"):
        Prefetcher([], depth=0)
    with pytest.raises(TypeError, match="depth must be an int"):
        Prefetcher([], depth=1.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("state", ["blocked_in_put", "blocked_in_source"])
def test_interpreter_exit_does_not_hang(state):
    code = textwrap.dedent(
        f"""
        import itertools, time
        from stoker.loader.prefetch import prefetch

        def slow():
            for i in itertools.count():
                if {state!r} == "blocked_in_source" and i == 2:
                    time.sleep(3600)
                yield i

        p = prefetch(slow(), depth=1)
        print(next(p), flush=True)
        time.sleep(0.1)
        """
    )
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0"
    assert time.monotonic() - t0 < 15


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    from stoker.pack import make_sample_data, pack

    root = tmp_path_factory.mktemp("prefetch")
    images = make_sample_data(root / "images", classes=2, per_class=12, size=32, workers=1)
    pack(images, root / "train", workers=1, progress=False)
    return root / "train.rec"


def test_over_the_real_loader_batches_stay_valid_and_slots_come_back(rec):
    import stoker
    from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize

    def loader():
        tf = Compose([Resize(32), RandomCrop(28), HorizontalFlip()])
        return stoker.Loader(rec, batch_size=4, workers=2, seed=3, prefetch=2, transforms=tf)

    with loader() as ld:
        direct = [(b.images.copy(), b.keys.copy()) for b in ld]
    with loader() as ld:
        got = []
        for b in prefetch(ld, depth=2):
            time.sleep(0.01)  # the thread runs ahead while the consumer works
            got.append((b.images.copy(), b.keys.copy()))
        # break early, then a full epoch still runs: every slot came back
        for i, _ in enumerate(prefetch(ld, depth=2)):
            if i == 1:
                break
        assert sum(len(b) for b in ld) > 0
    assert len(got) == len(direct) == 6
    for (gi, gk), (di, dk) in zip(got, direct):
        assert np.array_equal(gk, dk)
        assert np.array_equal(gi, di)
