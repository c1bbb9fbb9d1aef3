"""CudaPrefetcher's stream protocol where the deferred fake used to hide faults: launches that
fail part-way (submissions run at once, as on CUDA), events that complete late, pinned and
on-device inputs, staging pools across many shapes, and iterations that overlap or fail to
shut down cleanly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_doubles import IMAGENET_MEAN as MEAN
from torch_doubles import IMAGENET_STD as STD
from torch_doubles import EagerBackend, FakeBackend, SlotRing, random_images

from stoker.torch import CudaPrefetcher
from stoker.torch._staging import MAX_SHAPES

OOM = torch.cuda.OutOfMemoryError
NEVER = 10**9  # an event lag: events complete only when waited for or completed by the test


def _arrays(n, shape=(2, 4, 4, 3), seed=0):
    return [random_images(shape, seed=seed + i) for i in range(n)]


def _ref(a, mean=None, std=None):
    t = torch.from_numpy(a).permute(0, 3, 1, 2).float()
    if mean is not None:
        m = torch.tensor([v * 255 for v in mean]).view(1, -1, 1, 1)
        t = (t - m) / torch.tensor([v * 255 for v in std]).view(1, -1, 1, 1)
    return t


class Rings:
    """A loader whose successive iterations are successive loaders (other data each time)."""

    def __init__(self, *loaders):
        self.loaders = list(loaders)

    def __iter__(self):
        return iter(self.loaders.pop(0))


# --- 1. a launch that fails part-way gives back its slot, and its buffers once safe ---


@pytest.mark.parametrize("fault", ["mean_mismatch", "oom_copy", "oom_convert", "interrupt"])
def test_failed_launch_releases_its_slot(fault):
    be = EagerBackend(lag=NEVER)
    shape = (2, 4, 4, 1) if fault == "mean_mismatch" else (2, 4, 4, 3)
    ring = SlotRing.over(_arrays(4, shape), slots=3)
    pf = CudaPrefetcher(ring, mean=MEAN, std=STD, depth=1, backend=be)
    expected: type[BaseException] = OOM
    if fault == "mean_mismatch":
        expected = ValueError  # raised by the conversion, which runs inside the launch
    elif fault == "oom_copy":
        be.fail("to_device", OOM("CUDA out of memory"))
    elif fault == "oom_convert":
        be.fail("submit", OOM("CUDA out of memory"), at=2)  # copy, then conversion
    else:
        be.fail("submit", KeyboardInterrupt(), at=2)
        expected = KeyboardInterrupt
    with pytest.raises(expected):
        list(pf)
    assert sorted(ring.free) == [0, 1, 2], "the failed launch kept its slot"
    be.complete_all()
    assert be.violations == []


def test_oom_retry_loop_does_not_run_out_of_slots():
    arrays = _arrays(3, seed=10)
    be = EagerBackend(lag=1)
    ring = SlotRing.over(arrays, slots=3)
    pf = CudaPrefetcher(ring, depth=1, backend=be)
    for _attempt in range(5):
        be.fail("to_device", OOM("CUDA out of memory"), at=3)  # batch 1's image copy
        with pytest.raises(OOM):
            list(pf)
    outs = [o.images.clone() for o in pf]
    be.complete_all()
    assert be.violations == []
    assert len(outs) == 3
    for a, o in zip(arrays, outs):
        assert torch.equal(o, _ref(a))
    assert sorted(ring.free) == [0, 1, 2]


@pytest.mark.parametrize("pinned", [False, True], ids=["staged", "pinned-slots"])
def test_failed_copy_keeps_what_it_reads_until_its_event(pinned):
    """The labels copy of batch 0 fails after its images copy was queued: the staging buffer
    (or, for pinned slots, the slot) that queued copy reads must not be refilled or released
    before an event after it has completed, even when the user retries at once."""
    be = EagerBackend(lag=NEVER)
    first, second = _arrays(4, seed=20), _arrays(4, seed=40)
    pin = be.pin if pinned else None
    ring_a, ring_b = SlotRing.over(first, slots=3, pin=pin), SlotRing.over(second, slots=3, pin=pin)
    pf = CudaPrefetcher(Rings(ring_a, ring_b), depth=1, backend=be)
    be.fail("to_device", OOM("CUDA out of memory"), at=2)
    with pytest.raises(OOM):
        list(pf)
    assert sorted(ring_a.free) == [0, 1, 2]
    outs = [o.images.clone() for o in pf]  # the retry reuses the pools
    be.complete_all()
    assert be.violations == [], "a buffer was refilled or released before its copy ran"
    for a, o in zip(second, outs):
        assert torch.equal(o, _ref(a))
    assert sorted(ring_b.free) == [0, 1, 2]


def test_failed_launch_without_an_event_drops_its_buffers():
    be = EagerBackend(lag=NEVER)
    ring = SlotRing.over(_arrays(3, seed=60), slots=3)
    pf = CudaPrefetcher(ring, depth=1, backend=be)
    be.fail("to_device", OOM("CUDA out of memory"), at=2)
    be.fail("record_event", RuntimeError("CUDA error: device-side assert"))
    with pytest.raises(OOM):
        list(pf)
    assert sorted(ring.free) == [0, 1, 2]
    assert pf._pools is not None and sum(pf._pools.sizes().values()) == 0


# --- 2. device-resident inputs, and pinned ones ---


def test_device_inputs_are_recorded_on_the_side_stream():
    be = FakeBackend(lag=1)
    arrays = _arrays(4, seed=80)
    inputs = [
        (be.on_device(torch.from_numpy(a)), be.on_device(torch.arange(2) + i))
        for i, a in enumerate(arrays)
    ]
    outs = [
        (x.clone(), y.clone()) for x, y in CudaPrefetcher(inputs, mean=MEAN, std=STD, backend=be)
    ]
    for x, y in inputs:
        assert (id(x), "side1") in be.recorded, "a device input read on the side stream"
        assert (id(y), "side1") in be.recorded
    assert be.pinned == 0, "nothing is staged"
    for i, (a, (x, y)) in enumerate(zip(arrays, outs)):
        assert torch.allclose(x, _ref(a, MEAN, STD))
        assert torch.equal(y, torch.arange(2) + i)


@pytest.mark.parametrize("lag", [0, 2, NEVER])
@pytest.mark.parametrize("depth", [1, 2])
def test_pinned_slots_are_copied_directly_and_held_until_their_copy_ran(lag, depth):
    be = FakeBackend(lag=lag, hold_events=True)
    arrays = _arrays(8, seed=100)

    def retained(batch):
        batch.copy_event = len(be.events)

    def released(batch):
        assert be.events[batch.copy_event].done, "a pinned slot released before its copy ran"

    ring = SlotRing.over(
        arrays, slots=depth + 2, pin=be.pin, on_retain=retained, on_release=released
    )
    outs = [o.images.clone() for o in CudaPrefetcher(ring, depth=depth, backend=be)]
    for a, o in zip(arrays, outs):
        assert torch.equal(o, _ref(a))
    assert be.pinned == 0, "pinned slots are not staged"
    assert sorted(ring.free) == list(range(depth + 2))


# --- 3. staging pools stay bounded ---


def test_pinned_pools_keep_at_most_max_shapes():
    be = FakeBackend(lag=0)
    widths = list(range(4, 20))
    batches = [(random_images((2, 4, w, 3), seed=w), np.arange(2)) for w in widths]
    pf = CudaPrefetcher(batches, depth=1, backend=be)
    outs = [o[0].clone() for o in pf]
    assert pf._pools is not None
    sizes = pf._pools.sizes()
    assert len(sizes) <= MAX_SHAPES, sizes
    assert all(n <= pf.depth + 2 for n in sizes.values())
    for (a, _), o in zip(batches, outs):
        assert torch.equal(o, _ref(a))


def test_pools_are_reused_across_epochs_with_a_partial_last_batch():
    be = FakeBackend(lag=1)
    arrays = _arrays(5, (4, 4, 4, 3)) + _arrays(1, (2, 4, 4, 3), seed=9)
    pf = CudaPrefetcher([(a, np.arange(len(a))) for a in arrays], depth=2, backend=be)
    list(pf)
    made = be.pinned
    for _ in range(3):
        assert len(list(pf)) == 6
    assert be.pinned == made, "the same buffers serve every epoch"


# --- 4. each iteration owns its state ---


def test_closing_one_iteration_leaves_another_ones_slots_alone():
    be = FakeBackend(lag=NEVER, hold_events=True)
    first, second = _arrays(6, seed=120), _arrays(6, seed=140)
    ring_a, ring_b = SlotRing.over(first, slots=3), SlotRing.over(second, slots=3)
    pf = CudaPrefetcher(Rings(ring_a, ring_b), depth=1, backend=be)
    a = iter(pf)
    next(a)
    b = iter(pf)
    outs = [next(b).images.clone()]
    held = 3 - len(ring_b.free)
    assert held == 2  # the batch handed over and the one copied ahead
    a.close()
    assert 3 - len(ring_b.free) == held, "closing one iteration released another one's slots"
    outs += [o.images.clone() for o in b]
    for x, o in zip(second, outs):
        assert torch.equal(o, _ref(x))
    assert sorted(ring_a.free) == [0, 1, 2] and sorted(ring_b.free) == [0, 1, 2]


def test_shutdown_releases_every_slot_when_a_wait_fails():
    be = FakeBackend(lag=NEVER, hold_events=True)
    ring = SlotRing.over(_arrays(8, seed=160), slots=4)
    closed = []

    def loader():
        try:
            yield from ring
        finally:
            closed.append(True)

    it = iter(CudaPrefetcher(loader(), depth=2, backend=be))
    next(it)
    next(it)
    assert 4 - len(ring.free) >= 2
    be.fail("event_wait", RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        it.close()
    assert sorted(ring.free) == [0, 1, 2, 3], "a failed wait skipped the remaining releases"
    assert closed == [True], "the loader's iterator is closed"
