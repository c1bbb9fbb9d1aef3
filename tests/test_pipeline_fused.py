"""The pipeline runs a recognised chain as one fused op: the rows are those of the plain chain
(the same draws, the same bits on these sizes), in every layout, with or without a trailing
Normalize, after a reduced-scale decode, for any worker count and after a resume."""

from __future__ import annotations

import sys

import cv2
import numpy as np
import pytest

import stoker
from stoker._core.seeding import sample_rng
from stoker._core.specs import ArraySpec
from stoker.pipeline import Pipeline
from stoker.transforms import (
    CenterCrop,
    ColorJitter,
    Compose,
    HorizontalFlip,
    Normalize,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    Rotate,
)

ANY = ArraySpec((None, None, 3), "uint8")

HEADS = [
    [Resize(128), RandomCrop(112), HorizontalFlip()],
    [Resize(256, shorter_side=True), CenterCrop(224)],
    [RandomResizedCrop(96), HorizontalFlip()],
    [RandomCrop(100), HorizontalFlip(p=1.0)],
]
TAILS = [[], [Normalize(0.5, 0.5)], [Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]]


def photo(h: int, w: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([x * 255 / w, y * 255 / h, 128 + 90 * np.sin(x / 5) * np.cos(y / 7)], -1)
    return np.clip(img + rng.normal(0, 15, (h, w, 3)), 0, 255).astype(np.uint8)


def rows(p: Pipeline, imgs: list[np.ndarray], seed: int = 0) -> np.ndarray:
    out = np.full((len(imgs), *p.row_shape()), 7, p.dtype)
    for i, img in enumerate(imgs):
        p.fill_row(img, sample_rng(seed, 0, i), out[i], None, what="sample {}", args=(i,))
    return out


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("tail", TAILS, ids=["uint8", "norm", "imagenet"])
@pytest.mark.parametrize("head", HEADS, ids=["resize-crop", "centre", "rrc", "crop"])
def test_fused_rows_are_the_plain_chains(head, tail, layout):
    chain = Compose(head + tail)
    fused = Pipeline(ANY, transforms=chain, layout=layout)
    plain = Pipeline(ANY, transforms=chain, layout=layout, fuse=False)
    assert fused._fused is not None and plain._fused is None
    imgs = [photo(*hw, seed=i) for i, hw in enumerate([(112, 112), (375, 500), (300, 260)] * 4)]
    np.testing.assert_array_equal(rows(fused, imgs), rows(plain, imgs))


@pytest.mark.parametrize("channels", [3, 4])
def test_many_sizes_and_their_return_give_the_chains_rows(channels):
    """The row writer keeps a plan and a buffer per crop position and size, per thread, at
    most a few buffer shapes at once: a stream of more sizes than that, coming back round
    again, still gets the plain chain's rows every time."""
    chain = Compose([Resize(128), RandomCrop(112), HorizontalFlip()])
    spec = ArraySpec((None, None, channels), "uint8")
    fused = Pipeline(spec, transforms=chain, layout="NCHW")
    plain = Pipeline(spec, transforms=chain, layout="NCHW", fuse=False)
    sizes = [(112 + 9 * k, 100 + 13 * k) for k in range(12)]  # 12 window shapes, over 8
    imgs = []
    for i, hw in enumerate(sizes * 3):
        img = photo(*hw, seed=i)
        imgs.append(np.dstack([img, img[:, :, :1]]) if channels == 4 else img)
    np.testing.assert_array_equal(rows(fused, imgs), rows(plain, imgs))


def test_threads_sharing_a_pipeline_get_their_own_rows():
    """One pipeline filled from several threads at once (a user's thread pool): each row is
    the plain chain's, as when one thread fills them all."""
    import threading

    chain = Compose([Resize(128), RandomCrop(112), HorizontalFlip()])
    fused = Pipeline(ANY, transforms=chain, layout="NCHW")
    imgs = [photo(*hw, seed=i) for i, hw in enumerate([(112, 112), (150, 130), (128, 200)] * 20)]
    want = rows(Pipeline(ANY, transforms=chain, layout="NCHW", fuse=False), imgs)
    got = np.zeros((4, *want.shape), want.dtype)
    start = threading.Barrier(4)

    def fill(k: int) -> None:  # every thread fills every row, into its own copy
        start.wait()
        for _ in range(10):
            for i, img in enumerate(imgs):
                fused.fill_row(img, sample_rng(0, 0, i), got[k, i], None, what="s", args=())

    threads = [threading.Thread(target=fill, args=(k,)) for k in range(4)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    for k in range(4):
        np.testing.assert_array_equal(got[k], want)


def test_rows_are_the_chain_called_on_the_image():
    """What a user reproduces outside the loader: ``chain(img, sample_rng(seed, epoch, i))``."""
    chain = Compose([Resize(128), RandomCrop(112), HorizontalFlip(), Normalize(0.5, 0.5)])
    p = Pipeline(ANY, transforms=chain, layout="NCHW")
    imgs = [photo(112, 112, i) for i in range(30)]
    got = rows(p, imgs, seed=4)
    for i, img in enumerate(imgs):
        want = chain(img, sample_rng(4, 0, i)).transpose(2, 0, 1)
        np.testing.assert_array_equal(got[i], want)


@pytest.mark.parametrize("tail", TAILS[:2], ids=["uint8", "norm"])
@pytest.mark.parametrize(
    "head",
    HEADS + [[CenterCrop(100), HorizontalFlip()], [Resize(120), RandomCrop(100)]],
    ids=["resize-crop", "centre", "rrc", "crop", "centre-flip", "no-flip"],
)
def test_a_row_from_the_first_block_is_the_row_from_the_generator(head, tail):
    """A worker gives the row writer each sample's first draws computed for its whole chunk
    (``SampleRngs.first_blocks``) instead of a re-keyed generator: the rows are the same. A
    head that draws more (a random resized crop) declines that, before any draw, and takes
    the generator."""
    from stoker._core.seeding import SampleRngs

    p = Pipeline(ANY, transforms=Compose(head + tail), layout="NCHW")
    write = p.row_writer()
    assert write is not None
    imgs = [photo(*hw, seed=i) for i, hw in enumerate([(112, 112), (375, 500), (300, 260)] * 4)]
    firsts = SampleRngs(3, 2).first_blocks(np.arange(len(imgs))).tolist()
    want = np.zeros((len(imgs), *p.row_shape()), p.dtype)
    got = np.zeros_like(want)
    for i, img in enumerate(imgs):
        assert write(img, sample_rng(3, 2, i), want[i])
        took = write(img, None, got[i], firsts[i])
        assert took is p.row_draws_first_block()
        if not took:  # declined: nothing written, and the generator's way gives the row
            assert not got[i].any()
            assert write(img, sample_rng(3, 2, i), got[i])
    np.testing.assert_array_equal(got, want)
    assert p.row_draws_first_block() is not isinstance(head[0], RandomResizedCrop)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_the_row_writer_declines_odd_images_before_any_draw(layout):
    """A worker's hot loop writes rows through ``row_writer``; an image it does not take (grey
    HW, four channels where the chain makes three, too small for the crop, float) is declined
    with ``False`` and the generator untouched, and ``fill_row`` then gives the plain chain's
    row or its error."""
    chain = Compose([Resize(128), RandomCrop(112), HorizontalFlip()])
    p = Pipeline(ANY, transforms=chain, layout=layout)
    write = p.row_writer()
    assert write is not None and p.row_writer(width=64) is None
    dest = np.zeros(p.row_shape(), np.uint8)
    rgb = photo(100, 90, 1)
    odd = [rgb[:, :, 0], np.dstack([rgb, rgb[:, :, :1]]), rgb.astype(np.float32)]
    for img in odd:
        rng = sample_rng(0, 0, 5)
        assert write(img, rng, dest) is False
        assert rng.integers(0, 2**62) == sample_rng(0, 0, 5).integers(0, 2**62)  # no draw
        assert not dest.any()
    small = Pipeline(ANY, transforms=Compose([RandomCrop(112), HorizontalFlip()]), layout=layout)
    rng = sample_rng(0, 0, 5)
    assert small.row_writer()(rgb, rng, dest) is False
    assert rng.integers(0, 2**62) == sample_rng(0, 0, 5).integers(0, 2**62)
    with pytest.raises(stoker.SpecError, match="smaller than the crop"):
        small.fill_row(rgb, sample_rng(0, 0, 5), dest, None, what="sample {}", args=(3,))
    # one-channel HWC sets take the step-by-step path, with the chain's rows
    one = Pipeline(ArraySpec((None, None, 1), "uint8"), transforms=chain, layout=layout)
    assert one.row_writer() is None
    img1 = rgb[:, :, :1].copy()
    got1 = np.zeros(one.row_shape(), np.uint8)
    one.fill_row(img1, sample_rng(0, 0, 4), got1, None, what="s", args=())
    want1 = chain(img1, sample_rng(0, 0, 4))
    np.testing.assert_array_equal(got1, want1.transpose(2, 0, 1) if layout == "NCHW" else want1)
    # a grey image still gets the plain chain's row (the chain works on HW images)
    grey = rgb[:, :, 0]
    got = np.zeros(p.row_shape()[:2] if layout == "NHWC" else (1, 112, 112), np.uint8)
    p1 = Pipeline(ArraySpec((None, None), "uint8"), transforms=chain, layout=layout)
    want = chain(grey, sample_rng(0, 0, 2))
    p1.fill_row(grey, sample_rng(0, 0, 2), got.reshape(p1.row_shape()), None, what="s", args=())
    np.testing.assert_array_equal(got.reshape(want.shape), want)


def test_other_chains_keep_the_step_by_step_path():
    assert (
        Pipeline(ANY, transforms=Compose([Resize(128), RandomCrop(112), Rotate(5)]))._fused is None
    )
    with_jitter = Compose([Resize(128), RandomCrop(112), ColorJitter(0.2), Normalize()])
    assert Pipeline(ANY, transforms=with_jitter)._fused is None
    paired = Pipeline(ANY, transforms=Compose(HEADS[0]), pair_with=HorizontalFlip(p=1.0))
    assert paired._fused is None  # pair_with starts from the sample: no row-only path
    floats = ArraySpec((None, None, 3), "float32")
    assert Pipeline(floats, transforms=Compose([Resize(64), CenterCrop(48)]))._fused is None


def test_a_per_batch_width_goes_the_plain_way():
    chain = Compose([Resize(64), RandomCrop(48), HorizontalFlip()])
    p = Pipeline(ANY, transforms=chain, variable_width=True)
    img = photo(80, 90, 0)
    out = np.zeros((48, 40, 3), np.uint8)
    p.fill_row(img, sample_rng(0, 0, 0), out, 40, what="x")
    want = Pipeline(ANY, transforms=chain, variable_width=True, fuse=False)
    ref = np.zeros_like(out)
    want.fill_row(img, sample_rng(0, 0, 0), ref, 40, what="x")
    np.testing.assert_array_equal(out, ref)


def test_a_reduced_scale_decode_feeds_the_fused_chain():
    """Resize 128 of a 448x448 JPEG: decoded at 1/2 (224x224) for the fused chain too."""
    ok, buf = cv2.imencode(".jpg", photo(448, 448, 1), [cv2.IMWRITE_JPEG_QUALITY, 92])
    assert ok
    chain = Compose([Resize(128), RandomCrop(112), HorizontalFlip(), Normalize(0.5, 0.5)])
    fused = Pipeline(ANY, transforms=chain, layout="NCHW")
    plain = Pipeline(ANY, transforms=chain, layout="NCHW", fuse=False)
    img = fused.decode_image(buf.tobytes())
    assert img.shape == (224, 224, 3)
    np.testing.assert_array_equal(rows(fused, [img] * 8), rows(plain, [img] * 8))


def _batches(ld) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(b.images.copy(), b.keys.copy()) for b in ld]


@pytest.mark.parametrize("batch_size", [5, 70])
def test_any_worker_count_and_a_resume_give_the_same_batches(batch_size):
    """Small chunks re-key a generator per sample; chunks of 32 samples or more (70 over two
    workers) take their first draws from one computation per chunk: the same rows."""
    rng = np.random.default_rng(3)
    n = 24 if batch_size < 32 else 160
    x = np.stack([photo(72, 80, i % 24) for i in range(n)])
    x[:, :4] = rng.integers(0, 256, (n, 4, 80, 3), np.uint8)
    y = np.arange(n) % 3
    chain = Compose([Resize(64), RandomCrop(56), HorizontalFlip(), Normalize(0.5, 0.5)])
    kw = dict(batch_size=batch_size, transforms=chain, layout="NCHW", shuffle=True, seed=8)
    runs = []
    for workers in (0, 2):
        with stoker.Loader((x, y), workers=workers, **kw) as ld:
            runs.append(_batches(ld))
    for (a, ka), (b, kb) in zip(*runs):
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(a, b)
    for images, keys in runs[0]:  # each row is the plain chain of its sample
        for row, k in zip(images, keys):
            want = chain(x[k], sample_rng(8, 0, int(k))).transpose(2, 0, 1)
            np.testing.assert_array_equal(row, want)
    with stoker.Loader((x, y), workers=2, **kw) as ld:
        it = iter(ld)
        next(it)
        next(it)
        state = ld.state_dict()
    with stoker.Loader((x, y), workers=0, **kw) as ld:
        ld.load_state_dict(state)
        rest = _batches(ld)
    assert len(rest) == len(runs[0]) - 2
    for (a, ka), (b, kb) in zip(runs[0][2:], rest):
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("flip", [False, True])
def test_write_chw_equals_the_transposing_copy(dtype, channels, flip):
    from stoker.transforms.fused import write_chw

    rng = np.random.default_rng(channels)
    big = (rng.random((40, 50, channels)) * 255).astype(dtype)
    img = big[3:35, 5:45]  # a crop's view, as the pipeline hands it
    want = (img[:, ::-1] if flip else img).transpose(2, 0, 1)
    ring = np.zeros((3, channels, 32, 40), dtype)
    write_chw(img, ring[1], flip=flip)
    np.testing.assert_array_equal(ring[1], want)
    assert not ring[0].any() and not ring[2].any()  # nothing written beside the row
    strided = np.zeros((channels, 32, 80), dtype)[:, :, ::2]  # not contiguous: the plain copy
    write_chw(img, strided, flip=flip)
    np.testing.assert_array_equal(strided, want)
