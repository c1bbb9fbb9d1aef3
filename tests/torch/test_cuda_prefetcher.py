"""CudaPrefetcher: conversion, structure, edge cases (CPU path), and the stream protocol
(a fake stream/event backend on the CPU whose copies really run late)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch_doubles import IMAGENET_MEAN as MEAN
from torch_doubles import IMAGENET_STD as STD
from torch_doubles import FakeBackend, SlotRing
from torch_doubles import random_images as _images

from stoker.torch import CudaPrefetcher, TensorBatch, convert_images
from stoker.torch._batch import flatten


def _reference(x: np.ndarray, mean, std, dtype, layout: str) -> torch.Tensor:
    t = torch.from_numpy(x)
    if layout == "NHWC":
        t = t.permute(0, 3, 1, 2)
    elif layout == "NHW":
        t = t.unsqueeze(1)
    t = t.to(torch.float32)
    if mean is not None:  # 0-1 units, scaled to the uint8 images' 0-255 as the prefetcher does
        mean = [mean] if isinstance(mean, float) else mean
        std = [std] if isinstance(std, float) else std
        m = torch.tensor([v * 255 for v in mean], dtype=torch.float32).view(1, -1, 1, 1)
        s = torch.tensor([v * 255 for v in std], dtype=torch.float32).view(1, -1, 1, 1)
        t = (t - m) / s
    return t.to(dtype)


# --- conversion (CPU path) ---


@pytest.mark.parametrize(
    "shape,layout,mean,std",
    [
        ((4, 16, 12, 3), "NHWC", MEAN, STD),
        ((3, 10, 10, 1), "NHWC", (0.5,), (0.25,)),
        ((5, 9, 7), "NHW", 100 / 255, 50 / 255),
        ((2, 3, 8, 20), "NCHW", MEAN, STD),
        ((4, 16, 12, 3), "NHWC", None, None),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_output_equals_reference_conversion(shape, layout, mean, std, dtype):
    x = _images(shape)
    labels = np.arange(shape[0], dtype=np.int64)
    pf = CudaPrefetcher([(x, labels)], device="cpu", mean=mean, std=std, dtype=dtype)
    (out,) = list(pf)
    images, got_labels = out
    ref = _reference(x, mean, std, dtype, layout)
    assert images.dtype == dtype
    assert images.shape == ref.shape
    assert images.is_contiguous()
    assert torch.equal(images, ref)
    assert torch.equal(got_labels, torch.from_numpy(labels))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_channels_last_memory_format(dtype):
    x = _images((4, 8, 6, 3), seed=1)
    (out,) = list(
        CudaPrefetcher([x], device="cpu", mean=MEAN, std=STD, dtype=dtype, channels_last=True)
    )
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert not out.is_contiguous()
    assert torch.equal(out, _reference(x, MEAN, STD, getattr(torch, dtype), "NHWC"))


def test_explicit_layout_overrides_the_guess():
    # (N, C, H, W) with W == 3 would be guessed NHWC
    x = _images((2, 3, 5, 3), seed=2)
    (out,) = list(CudaPrefetcher([x], device="cpu", layout="NCHW"))
    assert torch.equal(out, torch.from_numpy(x).float())
    with pytest.raises(ValueError, match="declared NHWC"):
        list(CudaPrefetcher([x[:, 0]], device="cpu", layout="NHWC"))


def test_channel_count_mismatch_is_a_clear_error():
    x = _images((2, 8, 8, 1))
    with pytest.raises(ValueError, match="3 channels but the images have 1"):
        list(CudaPrefetcher([x], device="cpu", mean=MEAN, std=STD))


def test_float_input_is_not_modified_in_place():
    x = torch.rand(2, 3, 8, 8) * 255
    before = x.clone()
    (out,) = list(CudaPrefetcher([x], device="cpu", mean=MEAN, std=STD))
    assert torch.equal(x, before)
    assert not torch.equal(out, x)


# --- structure ---


Pair = collections.namedtuple("Pair", "img target")


def test_structures_are_preserved():
    x = _images((2, 8, 8, 3), seed=3)
    y = np.array([3, 4])
    batches = [
        {"images": x, "labels": y, "name": "a", "meta": {"ids": y}},
        (x, y, "tag"),
        [x, y],
        Pair(x, y),
        {"image": x, "mask": x},
    ]
    pf = CudaPrefetcher(
        batches, device="cpu", mean=MEAN, std=STD, normalize_keys=("images", 0, "mask")
    )
    out = list(pf)
    ref = _reference(x, MEAN, STD, torch.float32, "NHWC")
    d, t, lst, nt, d2 = out
    assert set(d) == {"images", "labels", "name", "meta"} and d["name"] == "a"
    assert torch.equal(d["images"], ref) and torch.equal(d["labels"], torch.from_numpy(y))
    assert torch.equal(d["meta"]["ids"], torch.from_numpy(y))
    assert type(t) is tuple and t[2] == "tag" and torch.equal(t[0], ref)
    assert type(lst) is list and torch.equal(lst[0], ref)
    assert isinstance(nt, Pair) and torch.equal(nt.img, ref)
    # only the named key is converted: "image" is not in normalize_keys, "mask" is
    assert torch.equal(d2["image"], torch.from_numpy(x))
    assert torch.equal(d2["mask"], ref)


def test_torch_dataloader_batches():
    x = _images((10, 8, 8, 3), seed=4)
    y = torch.arange(10)
    ds = torch.utils.data.TensorDataset(torch.from_numpy(x), y)
    dl = torch.utils.data.DataLoader(ds, batch_size=4)
    out = list(CudaPrefetcher(dl, device="cpu", mean=MEAN, std=STD, dtype=torch.float16))
    assert [len(b[0]) for b in out] == [4, 4, 2]
    images = torch.cat([b[0] for b in out])
    assert torch.equal(images, _reference(x, MEAN, STD, torch.float16, "NHWC"))
    assert torch.equal(torch.cat([b[1] for b in out]), y)
    assert len(CudaPrefetcher(dl, device="cpu")) == 3


def test_empty_loader_yields_nothing():
    assert list(CudaPrefetcher([], device="cpu")) == []
    assert list(CudaPrefetcher(iter([]), device="cpu", mean=MEAN, std=STD)) == []


def test_exception_in_the_wrapped_loader_surfaces():
    def loader():
        yield _images((2, 4, 4, 3))
        raise KeyError("record 17")

    pf = CudaPrefetcher(loader(), device="cpu")
    it = iter(pf)
    next(it)
    with pytest.raises(KeyError, match="record 17"):
        next(it)


def test_cuda_request_without_cuda_falls_back_to_cpu_with_a_warning():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.warns(RuntimeWarning, match="CUDA is not available"):
        pf = CudaPrefetcher([_images((1, 4, 4, 3))], device="cuda", mean=0.5, std=0.25)
    assert pf.device == torch.device("cpu")
    (out,) = list(pf)
    assert out.shape == (1, 3, 4, 4)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"dtype": torch.int32}, "dtype must be"),
        ({"mean": MEAN}, "both mean and std"),
        ({"mean": MEAN, "std": (1.0, 0.0, 1.0)}, "std must not contain 0"),
        ({"flip_p": 1.5}, "flip_p must be a probability"),
        ({"depth": 0}, "depth must be an int >= 1"),
        ({"layout": "CHW"}, "layout must be one of"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CudaPrefetcher([], device="cpu", **kwargs)


def test_depth_beyond_the_loader_ring_is_refused():
    class LoaderLike(list):
        prefetch = 1

    with pytest.raises(ValueError, match="use depth <= 2 or a loader with prefetch >= 2"):
        CudaPrefetcher(LoaderLike(), device="cpu", depth=3)
    CudaPrefetcher(LoaderLike(), device="cpu", depth=2)


def test_unsupported_batch_type_is_a_type_error():
    with pytest.raises(TypeError, match="cannot move a batch of type int"):
        list(CudaPrefetcher([1, 2], device="cpu"))


# --- GPU-side augmentation (run on the CPU here) ---


def _aug(x, *, seed=0, epoch=0, flip_p=0.0, erase_p=0.0, n_batches=1):
    pf = CudaPrefetcher(
        [x] * n_batches, device="cpu", mean=MEAN, std=STD, flip_p=flip_p, erase_p=erase_p, seed=seed
    )
    pf.set_epoch(epoch)
    return list(pf)


def test_flip_all_and_none():
    x = _images((6, 5, 7, 3), seed=5)
    ref = _reference(x, MEAN, STD, torch.float32, "NHWC")
    assert torch.equal(_aug(x, flip_p=1.0)[0], ref.flip(-1))
    assert torch.equal(_aug(x, flip_p=0.0)[0], ref)


def test_flip_is_per_image_and_deterministic():
    x = _images((64, 4, 6, 3), seed=6)
    ref = _reference(x, MEAN, STD, torch.float32, "NHWC")

    def flipped(out):
        is_flip = [bool(torch.equal(out[i], ref[i].flip(-1))) for i in range(len(x))]
        same = [bool(torch.equal(out[i], ref[i])) for i in range(len(x))]
        assert all(a != b for a, b in zip(is_flip, same)), "each image is either flipped or not"
        return is_flip

    a = flipped(_aug(x, flip_p=0.5, seed=1)[0])
    assert 10 < sum(a) < 54
    assert a == flipped(_aug(x, flip_p=0.5, seed=1)[0])  # same (seed, epoch, batch)
    assert a != flipped(_aug(x, flip_p=0.5, seed=2)[0])  # another seed
    assert a != flipped(_aug(x, flip_p=0.5, seed=1, epoch=1)[0])  # another epoch
    b0, b1 = _aug(x, flip_p=0.5, seed=1, n_batches=2)
    assert flipped(b0) != flipped(b1)  # another batch number


def test_erase_fills_one_rectangle_per_image_with_zero():
    x = np.full((16, 20, 24, 3), 200, dtype=np.uint8)  # normalises to nonzero everywhere
    ref = _reference(x, MEAN, STD, torch.float32, "NHWC")
    out = _aug(x, erase_p=1.0, seed=3)[0]
    h, w = 20, 24
    for i in range(len(x)):
        changed = (out[i] != ref[i]).any(dim=0)
        assert (out[i][:, changed] == 0).all(), "erased pixels are 0 (the mean after normalising)"
        assert torch.equal(changed, (out[i] == 0).all(dim=0))
        rows = changed.any(dim=1).nonzero().flatten()
        cols = changed.any(dim=0).nonzero().flatten()
        assert len(rows) and len(cols)
        eh, ew = int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)
        assert int(changed.sum()) == eh * ew, "the erased region is one rectangle"
        assert 1 <= eh * ew <= round(h * w / 3) + max(h, w), "area within bounds"
    assert torch.equal(out, _aug(x, erase_p=1.0, seed=3)[0])
    assert not torch.equal(out, _aug(x, erase_p=1.0, seed=4)[0])
    assert torch.equal(_aug(x, erase_p=0.0, seed=3)[0], ref)


def test_flip_uses_the_stoker_batch_epoch_and_number():
    x = _images((32, 4, 4, 3), seed=7)
    a = SlotRing.over([x], epoch=5, first_number=9)
    b = SlotRing.over([x], epoch=5, first_number=9)
    (oa,) = list(CudaPrefetcher(a, device="cpu", flip_p=0.5, seed=0))
    (ob,) = list(CudaPrefetcher(b, device="cpu", flip_p=0.5, seed=0))
    (oc,) = list(
        CudaPrefetcher(SlotRing.over([x], epoch=6, first_number=9), device="cpu", flip_p=0.5)
    )
    assert torch.equal(oa.images, ob.images)
    assert not torch.equal(oa.images, oc.images)


# --- stoker batches: slot protocol ---


def test_stoker_batches_come_out_as_tensor_batches_on_cpu():
    arrays = [_images((4, 6, 6, 3), seed=s) for s in range(5)]
    ring = SlotRing.over(arrays, slots=2)
    outs = list(CudaPrefetcher(ring, device="cpu", mean=MEAN, std=STD))
    for i, (out, a) in enumerate(zip(outs, arrays)):
        assert isinstance(out, TensorBatch)
        assert torch.equal(out.images, _reference(a, MEAN, STD, torch.float32, "NHWC"))
        assert torch.equal(out.labels, torch.full((4,), i))  # copied out of the slot
        assert list(out.keys) == list(range(1000 * i, 1000 * i + 4))
        images, labels = out
        assert images is out.images
    assert sorted(ring.free) == [0, 1]


# --- the stream protocol, with a fake backend whose copies run late ---


def _checked_ring(arrays, backend, **kw):
    """A ring that asserts, when a batch's slot is released, that its copy event has completed
    (the copy event of a batch is the next one recorded after it is retained); and the list of
    the batch numbers released."""
    released = []

    def retained(batch):
        batch.copy_event_index = len(backend.events)

    def check(batch):
        ev = backend.events[batch.copy_event_index]
        assert ev.done, f"slot of batch {batch.number} released before its copy finished"
        released.append(batch.number)

    return SlotRing.over(arrays, on_retain=retained, on_release=check, **kw), released


@pytest.mark.parametrize("lag", [0, 1, 3, 50])
@pytest.mark.parametrize("depth", [1, 2])
def test_fake_streams_slot_released_only_after_copy_and_data_intact(lag, depth):
    """Fault B5 #56: a slot or staging buffer is reused only after its copy event completed."""
    arrays = [_images((3, 5, 4, 3), seed=100 + i) for i in range(12)]
    be = FakeBackend(lag=lag)
    ring, released = _checked_ring(arrays, be, slots=depth + 2)
    pf = CudaPrefetcher(ring, mean=MEAN, std=STD, depth=depth, backend=be)
    outs = []
    for out in pf:
        # the consumer's step runs now; then the loader may reuse slots and buffers
        outs.append((out.images.clone(), out.labels.clone()))
    for i, (images, labels) in enumerate(outs):
        assert torch.equal(images, _reference(arrays[i], MEAN, STD, torch.float32, "NHWC")), i
        assert torch.equal(labels, torch.full((3,), i))
    assert sorted(released) == list(range(12)), "every slot came back"
    assert sorted(ring.free) == list(range(depth + 2))
    # pinned staging buffers are reused: at most depth + 2 per (shape, dtype), 2 keys here
    assert be.pinned <= 2 * (depth + 2)


def test_fake_streams_pinned_buffer_not_reused_before_its_copy_ran():
    """With copies that never finish on their own, every output must still be right: the
    prefetcher must wait for a buffer's copy before it refills that buffer."""
    arrays = [_images((2, 4, 4, 3), seed=200 + i) for i in range(10)]
    be = FakeBackend(lag=10**9)
    outs = [
        o.clone()
        for o, _ in CudaPrefetcher([(a, np.zeros(2)) for a in arrays], depth=2, backend=be)
    ]
    for a, o in zip(arrays, outs):
        assert torch.equal(o, _reference(a, None, None, torch.float32, "NHWC"))
    assert be.pinned <= 2 * 4


def test_fake_streams_protocol_calls():
    arrays = [_images((2, 4, 4, 3), seed=300 + i) for i in range(4)]
    be = FakeBackend(lag=1)
    pf = CudaPrefetcher([(a, np.arange(2)) for a in arrays], depth=1, backend=be)
    for _epoch in range(3):
        got = list(pf)
        assert len(got) == 4
    assert be.streams_made == 1, "one side stream for the prefetcher's life, not one per epoch"
    # before each launch the side stream waits on the consumer stream
    launches = [i for i, e in enumerate(be.log) if e[0] == "submit"]
    waits = [i for i, e in enumerate(be.log) if e == ("wait_stream", "side1", "consumer")]
    assert len(waits) == 12 and len(launches) == 24  # copy + convert per batch
    for w, copy_submit in zip(waits, launches[::2]):
        assert w < copy_submit
    # the consumer waits on each batch's ready event (the second event of each batch)
    ready_waits = [e[2] for e in be.log if e[0] == "wait_event"]
    assert ready_waits == [2 * k + 1 for k in range(12)]
    # every output tensor is record_stream'ed on the consumer stream: 2 per batch
    assert len(be.recorded) == 24 and {s for _, s in be.recorded} == {"consumer"}


def test_fake_streams_empty_loader_and_exception_release_held_slots():
    be = FakeBackend(lag=10**9)
    assert list(CudaPrefetcher([], backend=be)) == []

    arrays = [_images((2, 4, 4, 3), seed=i) for i in range(3)]
    ring, released = _checked_ring(arrays, be, slots=4)

    def failing():
        yield from ring
        raise OSError("shard vanished")

    with pytest.raises(OSError, match="shard vanished"):
        for _ in CudaPrefetcher(failing(), depth=2, backend=be):
            pass
    assert sorted(released) == [0, 1, 2]


def test_fake_streams_break_releases_every_slot():
    arrays = [_images((2, 4, 4, 3), seed=i) for i in range(10)]
    be = FakeBackend(lag=10**9)
    ring, _released = _checked_ring(arrays, be, slots=3)
    pf = CudaPrefetcher(ring, depth=1, backend=be)
    it = iter(pf)
    next(it)
    next(it)
    it.close()  # what `break` does to the generator
    assert sorted(ring.free) == [0, 1, 2]


def test_convert_images_is_the_prefetcher_conversion():
    x = _images((3, 6, 5, 3), seed=9)
    got = convert_images(torch.from_numpy(x), mean=MEAN, std=STD, dtype=torch.float16)
    assert torch.equal(got, _reference(x, MEAN, STD, torch.float16, "NHWC"))


def test_fake_streams_two_leaves_of_one_shape_get_two_buffers():
    """Two same-shaped arrays in one batch must not share a staging buffer."""
    arrays = [(_images((2, 4, 4, 3), seed=i), _images((2, 4, 4, 3), seed=50 + i)) for i in range(6)]
    be = FakeBackend(lag=10**9)
    batches = [{"images": a, "mask": b} for a, b in arrays]
    pf = CudaPrefetcher(batches, depth=1, normalize_keys=("images",), backend=be)
    outs = [(o["images"].clone(), o["mask"].clone()) for o in pf]
    for (a, b), (oi, om) in zip(arrays, outs):
        assert torch.equal(oi, _reference(a, None, None, torch.float32, "NHWC"))
        assert torch.equal(om, torch.from_numpy(b))


# --- structure round trip (property) ---


_leaf = hs.builds(lambda n: np.full((n, 2), n, dtype=np.int64), hs.integers(1, 3))
_scalar = hs.one_of(hs.text(max_size=3), hs.integers(-5, 5), hs.none())
_tree = hs.recursive(
    hs.one_of(_leaf, _scalar),
    lambda kids: hs.one_of(
        hs.lists(kids, max_size=3),
        hs.lists(kids, max_size=3).map(tuple),
        hs.dictionaries(hs.text("abc", min_size=1, max_size=2), kids, max_size=3),
    ),
    max_leaves=8,
)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, torch.Tensor) and torch.equal(b, torch.from_numpy(a))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@settings(max_examples=60, deadline=None)
@given(
    hs.one_of(
        hs.lists(_tree, min_size=1, max_size=3),
        hs.dictionaries(hs.text("xy", min_size=1), _tree, min_size=1, max_size=3),
    )
)
def test_flatten_rebuild_round_trip(batch):
    tree = flatten(batch, ())
    assert not any(tree.targets)
    rebuilt = tree.rebuild([torch.from_numpy(leaf) for leaf in tree.leaves])
    assert _same(batch, rebuilt)
