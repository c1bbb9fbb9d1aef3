"""Region decode (``DecodeOptions(region=True)``): a ``RandomResizedCrop`` at the head of the
chain decodes only its box of a JPEG, and gets the pixels a whole decode gives."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

import stoker
from stoker import codecs
from stoker._core.errors import ImageDecodeError
from stoker.pipeline import DecodeOptions
from stoker.transforms import Compose, HorizontalFlip, Normalize, RandomResizedCrop

pytestmark = pytest.mark.skipif(codecs.REGION is None, reason="the region decoder is not built")

# OpenCV's imwrite flags beyond the quality: every layout libjpeg-turbo decodes differently
VARIANTS = {
    "4:2:0": [],
    "4:2:2": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422],
    "4:4:4": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444],
    "4:1:1": [cv2.IMWRITE_JPEG_SAMPLING_FACTOR, cv2.IMWRITE_JPEG_SAMPLING_FACTOR_411],
    "progressive": [cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
    "restart markers": [cv2.IMWRITE_JPEG_RST_INTERVAL, 3],
    "grey": [],
}


def jpeg(rng: np.random.Generator, variant: str, h: int, w: int) -> bytes:
    """A photo-like JPEG: smooth colour under grain, of any size (odd ones included)."""
    small = rng.integers(0, 256, (max(2, h // 16), max(2, w // 16), 3), np.uint8)
    img = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
    img = cv2.add(img, rng.integers(0, 24, (h, w, 3), np.uint8))
    if variant == "grey":
        img = img[:, :, 0]
    flags = [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(70, 96)), *VARIANTS[variant]]
    ok, buf = cv2.imencode(".jpg", img, flags)
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("fast", [False, True])
def test_a_region_is_the_whole_decode_sliced(fast):
    """500 JPEGs of every layout and of sizes that are and are not multiples of the MCU,
    each sliced at a RandomResizedCrop box and at boxes touching its edges: the very pixels of
    the whole decode (the same libjpeg-turbo arithmetic, so exact, not within a tolerance)."""
    rng = np.random.default_rng(7)
    crop = RandomResizedCrop(64)
    whole = codecs.decoder(fast=fast)
    lazy = codecs.decoder(fast=fast, region=True)
    names = list(VARIANTS)
    for i in range(500):
        h, w = (int(v) for v in rng.integers(17, 260, 2))
        buf = jpeg(rng, names[i % len(names)], h, w)
        img, want = lazy(buf), whole(buf)
        assert isinstance(img, codecs.JpegImage) and img.shape == want.shape == (h, w, 3)
        t, left, bh, bw = crop.params((h, w), rng)
        boxes = [(t, left, bh, bw), (0, 0, h, w), (h - 1, w - 1, 1, 1), (0, w - 9, h, 9)]
        for t, left, bh, bw in boxes:
            np.testing.assert_array_equal(
                img[t : t + bh, left : left + bw], want[t : t + bh, left : left + bw]
            )
        np.testing.assert_array_equal(np.asarray(img), want)


def test_damage_the_region_reads_is_named_as_a_whole_decode_names_it():
    """A JPEG cut short: a box in the missing rows raises what the whole decode raises; a box
    above the cut is decoded (the rows below a box are never read)."""
    buf = jpeg(np.random.default_rng(1), "4:2:0", 240, 320)
    cut = buf[: len(buf) // 2]
    with pytest.raises(ImageDecodeError) as whole:
        codecs.decode(cut)
    img = codecs.decoder(region=True)(cut)
    with pytest.raises(ImageDecodeError) as region:
        img[200:240, 0:320]
    assert str(region.value) == str(whole.value)
    top = img[0:16, 0:320]
    np.testing.assert_array_equal(top, codecs.decode(buf)[0:16])


def test_the_loader_gives_the_same_batches_with_region_decode(tmp_path):
    """A packed set through RandomResizedCrop + flip + Normalize, 2 workers: region decode on
    and off give the same batches, float32 NCHW and uint8 NHWC, on both engines (the portable
    one spawns its workers: each makes its own region decoder)."""
    rng = np.random.default_rng(3)
    for i in range(48):
        d = tmp_path / "images" / f"c{i % 3}"
        d.mkdir(parents=True, exist_ok=True)
        h, w = (int(v) for v in rng.integers(60, 200, 2))
        (d / f"{i:03d}.jpg").write_bytes(jpeg(rng, list(VARIANTS)[i % len(VARIANTS)], h, w))
    stoker.pack(tmp_path / "images", tmp_path / "train", workers=1, progress=False)
    chains = {
        "NCHW": Compose([RandomResizedCrop(48), HorizontalFlip(), Normalize(0.5, 0.25)]),
        "NHWC": Compose([RandomResizedCrop(48), HorizontalFlip()]),
    }
    for layout, chain in chains.items():
        runs = []
        engines = ("linux", "portable") if layout == "NCHW" else ("linux",)
        for region, engine in [(False, "linux"), *((True, e) for e in engines)]:
            with stoker.Loader(
                str(tmp_path / "train.rec"),
                batch_size=16,
                workers=2,
                transforms=chain,
                layout=layout,
                seed=5,
                engine=engine,
                decode=DecodeOptions(region=region),
            ) as ld:
                # two epochs: the workers make the second's (the first's may be made here)
                runs.append([(b.images.copy(), b.keys.copy()) for _ in range(2) for b in ld])
        for run in runs[1:]:
            assert len(run) == len(runs[0]) == 6
            for (a, ka), (b, kb) in zip(runs[0], run):
                np.testing.assert_array_equal(ka, kb)
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fast", [False, True])
def test_a_damaged_jpeg_gives_pixels_or_a_decode_error_never_a_crash(fast):
    """Bytes flipped, cut or zeroed anywhere in 300 JPEGs of every layout, each sliced at a
    random box: the box's pixels, or the ImageDecodeError a whole decode raises (damage below
    the box goes unread, so a box may decode where the whole image does not)."""
    rng = np.random.default_rng(11)
    lazy = codecs.decoder(fast=fast, region=True)
    names, decoded = list(VARIANTS), 0
    for i in range(300):
        h, w = (int(v) for v in rng.integers(16, 160, 2))
        buf = bytearray(jpeg(rng, names[i % len(names)], h, w))
        at = int(rng.integers(2, len(buf)))
        damage = i % 3
        if damage == 0:
            buf[at] ^= 1 << int(rng.integers(0, 8))
        elif damage == 1:
            del buf[at:]
        else:
            buf[at : at + 64] = bytes(len(buf[at : at + 64]))
        try:
            img = lazy(bytes(buf))
            top, left = int(rng.integers(0, img.shape[0])), int(rng.integers(0, img.shape[1]))
            box = img[top : img.shape[0], left : img.shape[1]]
        except ImageDecodeError:
            continue
        assert box.shape == (img.shape[0] - top, img.shape[1] - left, 3) and box.dtype == np.uint8
        decoded += 1
    assert 0 < decoded < 300
