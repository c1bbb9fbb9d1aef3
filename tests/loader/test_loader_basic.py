"""What users rely on in the normal path: shapes, labels, keys, order, and the same batches
for every worker count."""

from __future__ import annotations

import numpy as np
import pytest
from loader_helpers import (
    Identity,
    Invert,
    MarkWorker,
    NoShape,
    RandCrop,
    ToFloat,
    index_of,
    make_arrays,
)

from stoker import SpecError
from stoker.loader import ArraySource, FolderSource, Loader
from stoker.sampling import EpochOrder, Sampler


def collect(loader, epochs=1):
    out = []
    for _ in range(epochs):
        for b in loader:
            out.append(
                (
                    b.epoch,
                    b.number,
                    b.images.copy(),
                    b.labels.copy(),
                    b.keys.copy(),
                    b.indices.copy(),
                )
            )
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[0] == y[0] and x[1] == y[1]
        for u, v in zip(x[2:], y[2:]):
            assert u.dtype == v.dtype and u.shape == v.shape
            np.testing.assert_array_equal(u, v)


def test_arrays_in_order_unpack_and_keys(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=8, workers=2, seed=0) as loader:
        assert len(loader) == 8
        seen = []
        for images, labels in loader:
            seen.append((images.copy(), labels.copy()))
    imgs = np.concatenate([s[0] for s in seen])
    np.testing.assert_array_equal(imgs, x)
    np.testing.assert_array_equal(np.concatenate([s[1] for s in seen]), y)


def test_folder_labels_keys_and_classes(folder):
    src = FolderSource(folder)
    assert src.class_names == ["class_0", "class_1", "class_2"]
    with Loader(folder, batch_size=5, transforms=RandCrop(24, 24), workers=2, seed=1) as loader:
        batches = collect(loader)
    keys = np.concatenate([b[4] for b in batches])
    labels = np.concatenate([b[3] for b in batches])
    np.testing.assert_array_equal(keys, np.arange(len(src)))
    np.testing.assert_array_equal(labels, src.labels())
    assert batches[0][2].shape == (5, 24, 24, 3) and batches[0][2].dtype == np.uint8
    assert batches[-1][2].shape == (42 % 5, 24, 24, 3)


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_identical_output_for_every_worker_count(folder, workers):
    kw = dict(batch_size=7, transforms=RandCrop(20, 28), shuffle=True, seed=11)
    with Loader(folder, workers=0, **kw) as ref_loader:
        ref = collect(ref_loader, epochs=2)
    with Loader(folder, workers=workers, **kw) as loader:
        got = collect(loader, epochs=2)
    assert_same(ref, got)
    # epochs differ in order and augmentation
    assert not np.array_equal(ref[0][4], ref[len(ref) // 2][4])


def test_augmentation_is_per_sample_not_per_position(folder):
    """The same sample gets the same crop whatever batch it lands in (rng from its index)."""
    kw = dict(transforms=RandCrop(20, 20), seed=5, workers=2)
    with (
        Loader(folder, batch_size=6, shuffle=True, **kw) as a,
        Loader(folder, batch_size=4, **kw) as b,
    ):
        ra = {int(k): img.copy() for bt in a for k, img in zip(bt.keys, bt.images)}
        rb = {int(k): img.copy() for bt in b for k, img in zip(bt.keys, bt.images)}
    assert ra.keys() == rb.keys()
    for k in ra:
        np.testing.assert_array_equal(ra[k], rb[k])


def test_epoch_advances_by_itself_and_seed_none_is_kept(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=60, shuffle=True, workers=0) as loader:
        assert loader.epoch == 0
        e0 = next(iter(loader)).keys.copy()
        assert loader.epoch == 1  # a full pass (one batch) advanced it
        e1 = next(iter(loader)).keys.copy()
        assert not np.array_equal(e0, e1)
        state = loader.state_dict()
    assert isinstance(state["seed"], int)


def test_nchw_float_layout(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=16, transforms=ToFloat(), layout="NCHW", workers=2) as loader:
        b = next(iter(loader))
        assert b.images.shape == (16, 3, 12, 10) and b.images.dtype == np.float32
        assert b.images.flags.c_contiguous
        np.testing.assert_allclose(b.images, x[:16].transpose(0, 3, 1, 2) / 255.0, rtol=1e-6)
        assert loader.output_spec.shape == (3, 12, 10)


def test_pair_with_two_rows_per_sample(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=8, pair_with=Invert(), workers=2, seed=0) as loader:
        b = next(iter(loader))
        np.testing.assert_array_equal(b.images[:4], x[:4])
        np.testing.assert_array_equal(b.images[4:], 255 - x[:4])
        np.testing.assert_array_equal(b.labels, np.concatenate([y[:4], y[:4]]))
        np.testing.assert_array_equal(b.keys, [0, 1, 2, 3, 0, 1, 2, 3])
        assert len(loader) == 15
    with pytest.raises(ValueError, match="even"):
        Loader((x, y), batch_size=7, pair_with=Invert())


def test_drop_last_and_len(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=16, drop_last=True, workers=2) as loader:
        shapes = [b.images.shape[0] for b in loader]
    assert shapes == [16, 16, 16]


def test_open_shape_refused_naming_the_step(folder):
    with pytest.raises(
        SpecError, match=r"RandomCrop/Resize missing\? the chain ends in \(\?, \?, 3\) uint8"
    ):
        Loader(folder, batch_size=4, transforms=NoShape())
    with Loader(folder, batch_size=4, workers=0) as ld:  # one image size: no transforms needed
        assert ld.output_spec.shape == next(iter(ld)).images.shape[1:]


def test_bad_arguments(arrays):
    x, y = arrays
    with pytest.raises(ValueError, match="workers"):
        Loader((x, y), batch_size=4, workers=-1)
    with pytest.raises(TypeError, match="batch_size"):
        Loader((x, y), batch_size=4.0)
    with pytest.raises(ValueError, match="on_error"):
        Loader((x, y), batch_size=4, on_error="ignore")
    with pytest.raises(ValueError, match="timeout"):
        Loader((x, y), batch_size=4, timeout=0)
    with pytest.raises(TypeError, match="source"):
        Loader(object(), batch_size=4)
    with pytest.raises(ValueError, match="layout"):
        Loader((x, y), batch_size=4, layout="CHW")


def test_rank_split(arrays):
    x, y = arrays
    seen = []
    for rank in range(3):
        with Loader(
            (x, y), batch_size=8, rank=rank, world_size=3, shuffle=True, seed=2, workers=0
        ) as ld:
            seen.extend(int(k) for b in ld for k in b.keys)
    assert sorted(seen) == list(range(60))


class Buckets(Sampler):
    """Three widths, one per batch, like a length-bucketing sampler."""

    variable_width = True

    def __init__(self, n):
        self.inner = EpochOrder(n)

    def indices(self, epoch):
        return self.inner.indices(epoch)

    def __len__(self):
        return len(self.inner)

    def batch_widths(self, epoch, batch_size):
        nb = -(-len(self) // batch_size)
        return np.array([6, 10, 14][:nb] + [8] * max(0, nb - 3)) + 6 * epoch


@pytest.mark.parametrize("workers", [0, 2])
def test_per_batch_width_pads_or_squeezes(arrays, workers):
    x, y = arrays
    with Loader((x, y), batch_size=20, sampler=Buckets(60), workers=workers, layout="NCHW") as ld:
        bs = [(b.images.copy(), b.indices.copy()) for b in ld]
    assert [b[0].shape for b in bs] == [(20, 3, 12, 6), (20, 3, 12, 10), (20, 3, 12, 14)]
    np.testing.assert_array_equal(bs[1][0], x[20:40].transpose(0, 3, 1, 2))  # same width
    np.testing.assert_array_equal(bs[2][0][..., :10], x[40:60].transpose(0, 3, 1, 2))
    assert not bs[2][0][..., 10:].any()  # right padding is zero
    assert bs[0][0].shape[-1] == 6  # wider samples squeezed


def test_wider_epoch_rebuilds_the_ring(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=20, sampler=Buckets(60), workers=2) as ld:
        e0 = [b.images.shape for b in ld]
        e1 = [(b.images.shape, b.images[:, :, :10].copy()) for b in ld]
    assert [s[2] for s in e0] == [6, 10, 14]
    assert [s[0][2] for s in e1] == [12, 16, 20]
    np.testing.assert_array_equal(e1[2][1], x[40:60])


def test_negative_stride_readonly_outputs_copied(arrays):
    from loader_helpers import Strided

    x, y = arrays
    with Loader((x, y), batch_size=10, transforms=Strided(), workers=2) as ld:
        b = next(iter(ld))
        np.testing.assert_array_equal(b.images, x[:10, ::-1, ::-1])


def test_retained_batch_survives_next_and_release(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=4, transforms=Identity(), workers=2, prefetch=1) as ld:
        it = iter(ld)
        first = next(it).retain()
        for _ in range(5):
            next(it)
        np.testing.assert_array_equal(first.images, x[:4])
        first.release()
        rest = [index_of(b.images[0]) for b in it]
        assert rest[0] == 24


@pytest.mark.parametrize("retain", [False, True])
def test_prefetch_bounds_the_batches_made_ahead_and_the_spare_slot_waits_for_retain(
    arrays, monkeypatch, retain
):
    # while the consumer holds batch k, batches up to k + prefetch have been handed to the
    # workers and no more; the ring's spare slot (prefetch + 2 slots in all) is written, and
    # reserved, only when a retained batch leaves no other slot free (here: the first batch,
    # kept for the whole epoch)
    from stoker.loader import _shm
    from stoker.loader._pool import WorkerPool

    x, y = arrays
    sent: list[tuple[int, int]] = []  # (batch number, slot) of each task, in order
    reserved: list[int] = []
    real_spawn, real_reserve = WorkerPool._spawn, _shm.reserve

    def spawn(self, wid):
        handle = real_spawn(self, wid)
        send = handle.conn.send

        def recording_send(task):
            if task is not None:
                sent.append((task.number, task.slot))
            return send(task)

        handle.conn.send = recording_send
        return handle

    def reserve(seg, offset=0, length=None):
        reserved.append(offset)
        return real_reserve(seg, offset, length)

    monkeypatch.setattr(WorkerPool, "_spawn", spawn)
    monkeypatch.setattr(_shm, "reserve", reserve)
    prefetch = 2
    got = []
    with Loader((x, y), batch_size=4, transforms=Identity(), workers=2, prefetch=prefetch) as ld:
        kept = None
        for b in ld:
            assert max(n for n, _ in sent) <= b.number + prefetch
            got.append(index_of(b.images[0]))
            if retain and kept is None:
                kept = b.retain()
        if kept is not None:
            np.testing.assert_array_equal(kept.images, x[:4])
            kept.release()
    assert got == list(range(0, len(x), 4))
    slots = {slot for _, slot in sent}
    assert slots == (set(range(prefetch + 2)) if retain else set(range(prefetch + 1)))
    assert len(reserved) == 1 + len(slots)  # the control block, then each slot used


def test_array_source_crosses_processes_once(arrays, shm_names):
    x, y = arrays
    before = shm_names()
    src = ArraySource(x, y)
    src.share()
    assert len(shm_names() - before) == 1
    with Loader(src, batch_size=30, workers=2) as ld:
        got = np.concatenate([b.images.copy() for b in ld])
    np.testing.assert_array_equal(got, x)
    assert len(shm_names() - before) == 1  # the user's source stays until they close it
    src.close()
    assert shm_names() == before


def test_kept_view_after_close_stays_readable(arrays):
    x, y = arrays
    ld = Loader((x, y), batch_size=4, workers=1)
    b = next(iter(ld))
    ld.close()
    ld.close()
    np.testing.assert_array_equal(b.images, x[:4])  # still mapped: no crash


def _reference_rows(chain, x, indices, *, seed, layout, epoch=0):
    """What the loader must deliver: the chain on each sample with its own generator, placed."""
    from stoker._core.seeding import sample_rng

    rows = []
    for i in indices:
        out = chain(x[i], sample_rng(seed, epoch, int(i)))
        if layout == "NCHW":
            out = out[None] if out.ndim == 2 else out.transpose(2, 0, 1)
        rows.append(out)
    return np.stack(rows)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("channels", [3, 1, None])
def test_trailing_normalize_gives_the_chains_bits_in_the_batch(arrays, layout, channels):
    # A chain ending in Normalize is written straight into the batch row; the rows must be
    # bit for bit what running the chain and placing its output gives.
    from stoker.transforms import Compose, HorizontalFlip, Normalize, RandomCrop

    x, y = arrays
    if channels is None:
        x = np.ascontiguousarray(x[..., 0])
        stats = (0.4, 0.3)
    elif channels == 1:
        x = np.ascontiguousarray(x[..., :1])
        stats = (0.4, 0.3)
    else:
        stats = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    chain = Compose([RandomCrop((9, 7)), HorizontalFlip(), Normalize(*stats)])
    with Loader(
        (x, y), batch_size=16, transforms=chain, layout=layout, workers=2, seed=5, shuffle=True
    ) as loader:
        b = next(iter(loader))
        got, idx = b.images.copy(), b.indices.copy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _reference_rows(chain, x, idx, seed=5, layout=layout))


@pytest.mark.parametrize("workers", [0, 2])
def test_per_batch_width_with_normalize_pads_normalised_rows_with_zeros(arrays, workers):
    from stoker.transforms import Normalize

    x, y = arrays
    norm = Normalize(0.5, 0.25)
    with Loader(
        (x, y), batch_size=20, transforms=norm, sampler=Buckets(60), workers=workers, layout="NCHW"
    ) as ld:
        bs = [b.images.copy() for b in ld]
    full = _reference_rows(norm, x, range(60), seed=0, layout="NCHW")
    np.testing.assert_array_equal(bs[1], full[20:40])  # the chain's own width: written in place
    np.testing.assert_array_equal(bs[2][..., :10], full[40:60])
    assert not bs[2][..., 10:].any()  # padding is zero after normalising, as documented


def test_a_worker_that_falls_behind_gets_less_work():
    # worker 0 is slow (as when other jobs preempt it): chunks go to the worker with the least
    # queued, so worker 1 makes most samples instead of idling while it waits for worker 0's
    # share of each batch to free a slot; the batches are the same either way
    x, y = make_arrays(240)
    with Loader((x, y), batch_size=8, workers=2, transforms=MarkWorker(0.02, 0.002)) as ld:
        got = [(b.images.copy(), b.indices.copy()) for b in ld]
    images = np.concatenate([g[0] for g in got])
    assert [index_of(im) for im in images] == list(range(len(x)))
    made_by = images[:, 0, 0, 2]
    assert set(made_by.tolist()) <= {1, 2}
    assert (made_by == 1).sum() <= len(x) // 4, made_by  # an even split would be half
    np.testing.assert_array_equal(images[..., :2], x[..., :2])


def test_a_batch_without_declared_fields_answers_by_the_names_its_errors_give():
    x = np.arange(8 * 4 * 4 * 3, dtype=np.uint8).reshape(8, 4, 4, 3)
    y = np.arange(8, dtype=np.int64)
    with Loader((x, y), batch_size=4, workers=0) as ld:
        b = next(iter(ld))
    assert "images" in b and "labels" in b and "boxes" not in b
    np.testing.assert_array_equal(b["images"], x[:4])
    np.testing.assert_array_equal(b["labels"], y[:4])
    with pytest.raises(KeyError, match=r"it has \['images', 'labels'\]"):
        b["boxes"]
