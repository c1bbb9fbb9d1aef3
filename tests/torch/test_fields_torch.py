"""Batches with fields at the torch edge: tensors, ragged as lists or padded, text on the host,
torchvision-style detection targets, and CudaPrefetcher moving the fields with the images
under the stream protocol (checked with the CPU backends of ``tests/torch/torch_doubles.py``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_doubles import (
    FIELD_SCHEMA,
    BrokenFakeBackend,
    EagerBackend,
    FakeBackend,
    FieldRing,
    field_batch,
)

import stoker.torch as st

pytestmark = pytest.mark.timeout(60)


def _rows(col: np.ndarray, n: np.ndarray) -> list[np.ndarray]:
    return [col[r, :k] for r, k in enumerate(n.tolist())]


def assert_same_batch(tb: st.TensorBatch, ref, *, device: bool = False) -> None:
    """``tb`` holds exactly what the stoker batch ``ref`` held, field by field."""
    assert isinstance(tb, st.TensorBatch) and tb.schema == ref.schema
    assert tb.images.shape[:1] == (len(ref),)
    assert torch.equal(tb.labels.cpu(), torch.from_numpy(ref.labels))
    assert torch.equal(tb["label"].cpu(), torch.from_numpy(ref.labels))
    for name in ("scores", "size"):
        assert torch.equal(tb[name].cpu(), torch.from_numpy(ref.fields[name])), name
    for name in ("boxes", "classes"):
        values, lengths = tb.padded(name)
        assert torch.equal(values.cpu(), torch.from_numpy(ref.fields[name]))
        assert lengths.dtype == torch.int32
        assert torch.equal(lengths.cpu(), torch.from_numpy(ref.lengths[name]))
        got = tb[name]
        want = _rows(ref.fields[name], ref.lengths[name])
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert torch.equal(g.cpu(), torch.from_numpy(w))
    assert tb["caption"] == ref["caption"]
    caption, n = tb.padded("caption")
    assert caption.device.type == "cpu" and n.device.type == "cpu"  # text stays on the host
    if device:
        for t in (*tb.fields.values(), *tb.lengths.values()):
            flagged = getattr(t, "_fake_on_device", False)
            assert flagged == (t is not caption and t is not n)


def test_batch_accessors_without_a_copy():
    b = field_batch(6, seed=3)
    tb = st.as_tensors([b]).__iter__().__next__()
    assert_same_batch(tb, b)
    # numeric and ragged columns are views of the batch's memory, like its images
    assert np.shares_memory(tb.fields["boxes"].numpy(), b.fields["boxes"])
    assert "boxes" in tb and "image" in tb and "label" in tb and "nope" not in tb
    with pytest.raises(KeyError, match="no field 'nope'"):
        tb["nope"]
    with pytest.raises(KeyError, match="not a variable-length field"):
        tb.padded("scores")


def test_field_tensors_ragged_as_lists_or_padded():
    b = field_batch(5, seed=1)
    as_lists = st.field_tensors(b)
    assert list(as_lists) == ["image", "label", *FIELD_SCHEMA.extra]
    assert torch.equal(as_lists["image"], torch.from_numpy(b.images))
    assert [t.shape[0] for t in as_lists["boxes"]] == b.lengths["boxes"].tolist()
    assert as_lists["caption"] == b["caption"]
    padded = st.field_tensors(b, ["boxes", "scores", "caption"], ragged="padded")
    values, lengths = padded["boxes"]
    assert values.shape == (5, 5, 4) and torch.equal(lengths, torch.from_numpy(b.lengths["boxes"]))
    assert isinstance(padded["scores"], torch.Tensor) and padded["caption"] == b["caption"]
    with pytest.raises(ValueError, match="ragged must be one of"):
        st.field_tensors(b, ragged="dense")


def test_detection_targets_torchvision_style():
    b = field_batch(6, seed=2)
    targets = st.detection_targets(b)
    assert len(targets) == 6
    for r, t in enumerate(targets):
        k = int(b.lengths["boxes"][r])
        assert set(t) == {"boxes", "labels"}
        assert t["boxes"].dtype == torch.float32 and t["boxes"].shape == (k, 4)
        assert t["labels"].dtype == torch.int64 and t["labels"].shape == (k,)
        assert torch.equal(t["boxes"], torch.from_numpy(b.fields["boxes"][r, :k]))
        assert torch.equal(t["labels"], torch.from_numpy(b.fields["classes"][r, :k]))
    assert targets[0]["boxes"].shape == (0, 4)  # an image with no objects is a valid target
    more = st.detection_targets(b, labels="classes", extra={"hw": "size", "text": "caption"})
    assert torch.equal(more[3]["hw"], torch.from_numpy(b.fields["size"][3]))
    assert more[3]["text"] == b["caption"][3]


def test_detection_targets_says_what_is_missing():
    b = field_batch(3)
    with pytest.raises(ValueError, match="not a boxes field"):
        st.detection_targets(b, boxes="classes")
    with pytest.raises(ValueError, match="one row per box"):
        st.detection_targets(b, labels="scores")
    with pytest.raises(KeyError, match="no field 'kind'"):
        st.detection_targets(b, extra=["kind"])
    images = np.zeros((2, 4, 4, 3), np.uint8)
    plain = st.TensorBatch(torch.from_numpy(images), torch.zeros(2))
    with pytest.raises(ValueError, match="carries no fields"):
        st.detection_targets(plain)


def test_prefetcher_on_the_cpu_copies_fields_out_of_the_slot():
    refs = [field_batch(4, seed=s) for s in range(5)]
    ring = FieldRing(refs, slots=3)
    out = list(st.CudaPrefetcher(ring, device="cpu", mean=(0.0,) * 3, std=(1.0,) * 3))
    assert ring.freed == 5
    for tb, ref in zip(out, refs):  # every slot was scribbled over: the outputs are copies
        assert_same_batch(tb, ref)
        assert tb.images.shape == (4, 3, 16, 20) and tb.images.dtype == torch.float32


@pytest.mark.parametrize("backend", ["fake", "eager"])
@pytest.mark.parametrize("depth", [1, 2])
def test_prefetcher_streams_move_fields_with_the_batch(backend, depth):
    be = FakeBackend(lag=3) if backend == "fake" else EagerBackend(lag=2)
    refs = [field_batch(4, seed=s) for s in range(7)]
    ring = FieldRing(refs, slots=depth + 2)
    seen = []
    for tb in st.CudaPrefetcher(ring, backend=be, depth=depth):
        assert_same_batch(tb, refs[len(seen)], device=True)  # read before the next batch
        seen.append(tb)
    assert len(seen) == 7 and ring.freed == 7
    assert be.violations == []
    # every staging buffer is kept for reuse: the field shapes did not push each other out
    assert be.pinned <= 2 * 6 * (depth + 2)


def test_a_broken_protocol_shows_in_the_fields():
    """Control: with events that complete at once, slots are scribbled (and sources dropped)
    before the deferred copies read them; the check above, or the rebuild, must see it."""
    refs = [field_batch(4, seed=s) for s in range(4)]
    with pytest.raises((AssertionError, ValueError)):
        for i, tb in enumerate(st.CudaPrefetcher(FieldRing(refs), backend=BrokenFakeBackend())):
            assert_same_batch(tb, refs[i])


def test_device_flip_is_refused_when_boxes_would_stay_behind():
    with pytest.raises(ValueError, match="flip_p flips the images on the device but not"):
        list(st.CudaPrefetcher(FieldRing([field_batch(2)]), device="cpu", flip_p=0.5))
    ring = FieldRing([field_batch(2)])
    with pytest.raises(ValueError, match="flip in the loader's transforms"):
        list(st.CudaPrefetcher(ring, backend=FakeBackend(), flip_p=0.5))
    assert ring.freed == 1  # refused before the slot was taken; the shutdown closed the ring
    # erasing moves nothing: allowed
    out = list(st.CudaPrefetcher(FieldRing([field_batch(2)]), device="cpu", erase_p=1.0))
    assert len(out) == 1


def test_pools_hold_every_field_shape_of_a_steady_run():
    be = FakeBackend(lag=1)
    refs = [field_batch(4, seed=s) for s in range(11)] + [field_batch(3, seed=11)]
    pf = st.CudaPrefetcher(FieldRing(refs), backend=be, depth=1)
    for _ in range(2):
        assert sum(1 for _ in pf) == 12
    # images, labels, boxes, classes, lengths (int32 (B,)), scores, size: 7 keys per batch
    # size, for the full batches and the partial last one, all kept
    assert len(pf._pools.sizes()) == 14
    made = be.pinned
    assert sum(1 for _ in pf) == 12
    assert be.pinned == made  # a third epoch allocates nothing new
