"""Transform throughput on one core: each stoker op beside the PIL (or NumPy) code doing the
same work, on 112×112 and 224×224 uint8 RGB images, measured in the same run.

PIL ops run on a ready ``PIL.Image`` (no array conversion counted, PIL's best case); stoker
ops run on the NumPy array. Rounds alternate between the two and the best round of each
counts, so a busy machine slows both alike. ``cv2.setNumThreads(1)``: single-core figures.

    python bench/bench_transforms.py [--quick] [--sizes 112 224]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np
from PIL import Image, ImageEnhance, ImageFilter

from stoker.transforms import (
    CenterCrop,
    ColorJitter,
    GaussianBlur,
    Grayscale,
    HorizontalFlip,
    Normalize,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    Rotate,
    ScaleTranslate,
    Sharpen,
    Shear,
    SineWarp,
    Smooth,
)
from stoker.transforms.color import adjust_brightness, adjust_contrast, adjust_saturation
from stoker.transforms.presets import seed000_train

NEAREST = Image.Resampling.NEAREST
BILINEAR = Image.Resampling.BILINEAR


def sample_image(size: int) -> np.ndarray:
    """A smooth colour image with some texture (content barely matters for these ops)."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    rng = np.random.default_rng(0)
    img = np.stack(
        [255 * x, 255 * y, 127 + 100 * np.sin(12 * x) * np.cos(9 * y)], axis=-1
    ) + rng.normal(0, 12, (size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def rate(fn: Callable[[], Any], seconds: float) -> float:
    """Calls per second over one round of about ``seconds``."""
    fn()
    n, t0 = 0, time.perf_counter()
    batch = 1
    while True:
        for _ in range(batch):
            fn()
        n += batch
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt
        batch = min(batch * 2, 256)


def compare(
    a: Callable[[], Any], b: Callable[[], Any], seconds: float, rounds: int
) -> tuple[float, float]:
    ra = rb = 0.0
    for _ in range(rounds):
        ra = max(ra, rate(a, seconds))
        rb = max(rb, rate(b, seconds))
    return ra, rb


Case = tuple[str, Callable[[], Any], Callable[[], Any], str]


class _Cases(list):
    """The cases of one group, in the order they print."""

    def add(self, name: str, ours: Callable[[], Any], ref: Callable[[], Any], what: str) -> None:
        self.append((name, ours, ref, what))


def cases(size: int) -> list[Case]:
    """(op, stoker call, reference call, what the reference is)."""
    img = sample_image(size)
    pil = Image.fromarray(img)
    gen = np.random.default_rng(1)
    out: list[Case] = []
    for group in (_resize_crop_cases, _affine_cases, _colour_cases, _chain_cases):
        out += group(size, img, pil, gen)
    return out


def _resize_crop_cases(
    size: int, img: np.ndarray, pil: Image.Image, gen: np.random.Generator
) -> list[Case]:
    """Resize, the crops and the flip."""
    out = _Cases()
    up = round(size * 128 / 112)  # the seed-000 upscale
    half = size // 2
    crop = size * 7 // 8
    r_up = Resize((up, up))
    out.add(
        f"Resize to {up} (bilinear)",
        lambda: r_up(img, gen),
        lambda: pil.resize((up, up), BILINEAR),
        "Image.resize BILINEAR",
    )
    r_half = Resize(half, shorter_side=True, interpolation="area")
    out.add(
        f"Resize to {half} (area)",
        lambda: r_half(img, gen),
        lambda: pil.resize((half, half), BILINEAR),
        "Image.resize BILINEAR (antialiased)",
    )
    rc = RandomCrop(crop)

    def pil_crop() -> Image.Image:
        t, left = rc.params((size, size), gen)
        return pil.crop((left, t, left + crop, t + crop))

    out.add(f"RandomCrop {crop} (view)", lambda: rc(img, gen), pil_crop, "Image.crop")
    cc = CenterCrop(crop)
    c0 = (size - crop) // 2
    out.add(
        f"CenterCrop {crop} (view)",
        lambda: cc(img, gen),
        lambda: pil.crop((c0, c0, c0 + crop, c0 + crop)),
        "Image.crop",
    )
    rrc = RandomResizedCrop(size)

    def pil_rrc() -> Image.Image:
        t, left, h, w = rrc.params((size, size), gen)
        return pil.resize((size, size), BILINEAR, box=(left, t, left + w, t + h))

    out.add("RandomResizedCrop", lambda: rrc(img, gen), pil_rrc, "Image.resize BILINEAR of the box")
    flip = HorizontalFlip(1.0)
    out.add(
        "HorizontalFlip",
        lambda: flip(img, gen),
        lambda: pil.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
        "Image.transpose",
    )
    return out


def _affine_cases(
    size: int, img: np.ndarray, pil: Image.Image, gen: np.random.Generator
) -> list[Case]:
    """Rotate (with its ceiling), Shear, ScaleTranslate, SineWarp."""
    out = _Cases()
    rot = Rotate(15)
    out.add(
        "Rotate ±15° (nearest)",
        lambda: rot(img, gen),
        lambda: pil.rotate(gen.uniform(-15, 15)),
        "Image.rotate",
    )
    rot_l = Rotate(15, interpolation="bilinear")
    out.add(
        "Rotate ±15° (bilinear)",
        lambda: rot_l(img, gen),
        lambda: pil.rotate(gen.uniform(-15, 15), BILINEAR),
        "Image.rotate BILINEAR",
    )

    # the ceiling of the nearest-neighbour rotate: OpenCV's own call, no stoker code around it
    def cv_rotate() -> np.ndarray:
        m = Rotate.matrix((size, size), float(gen.uniform(-15, 15)))
        return cv2.warpAffine(img, m, (size, size), flags=cv2.INTER_NEAREST)

    out.add(
        "  raw cv2.warpAffine nearest",
        cv_rotate,
        lambda: pil.rotate(gen.uniform(-15, 15)),
        "Image.rotate (the op's ceiling)",
    )
    sh = Shear(0.2, 0.2)

    def pil_shear() -> Image.Image:
        sx, sy = sh.params((size, size), gen)
        return pil.transform(pil.size, Image.Transform.AFFINE, (1, sx, 0, sy, 1, 0))

    out.add("Shear ±0.2", lambda: sh(img, gen), pil_shear, "Image.transform AFFINE")
    st = ScaleTranslate(size * 25 // 64, size * 63 // 64)

    def pil_scale() -> Image.Image:  # the seed's code: Image.resize default (BICUBIC) + paste
        t, left, h, w = st.params((size, size), gen)
        bg = Image.new("RGB", pil.size)
        bg.paste(pil.resize((w, h)), (left, t))
        return bg

    out.add(
        "ScaleTranslate (auto)", lambda: st(img, gen), pil_scale, "seed-002: resize BICUBIC + paste"
    )
    sw = SineWarp()

    def numpy_sine() -> np.ndarray:
        s = sw.shifts((size, size), sw.params((size, size), gen))
        t = np.asarray(pil).copy()
        for i in range(size):
            t[:, i] = np.roll(t[:, i], int(s[i]), axis=0)
        return t

    out.add("SineWarp", lambda: sw(img, gen), numpy_sine, "seed-002 np.roll loop")
    return out


def _colour_cases(
    size: int, img: np.ndarray, pil: Image.Image, gen: np.random.Generator
) -> list[Case]:
    """The filters, the colour adjustments and Grayscale (with its ceiling)."""
    out = _Cases()
    gb = GaussianBlur((0.5, 1.2))
    out.add(
        "GaussianBlur 0.5-1.2",
        lambda: gb(img, gen),
        lambda: pil.filter(ImageFilter.GaussianBlur(gen.uniform(0.5, 1.2))),
        "ImageFilter.GaussianBlur",
    )
    sp, sm = Sharpen(), Smooth()
    out.add(
        "Sharpen",
        lambda: sp(img, gen),
        lambda: pil.filter(ImageFilter.SHARPEN),
        "ImageFilter.SHARPEN",
    )
    out.add(
        "Smooth", lambda: sm(img, gen), lambda: pil.filter(ImageFilter.SMOOTH), "ImageFilter.SMOOTH"
    )
    out.add(
        "brightness",
        lambda: adjust_brightness(img, 1.3),
        lambda: ImageEnhance.Brightness(pil).enhance(1.3),
        "ImageEnhance.Brightness",
    )
    out.add(
        "contrast",
        lambda: adjust_contrast(img, 1.3),
        lambda: ImageEnhance.Contrast(pil).enhance(1.3),
        "ImageEnhance.Contrast",
    )
    out.add(
        "saturation",
        lambda: adjust_saturation(img, 1.3),
        lambda: ImageEnhance.Color(pil).enhance(1.3),
        "ImageEnhance.Color",
    )
    cj = ColorJitter(0.4, 0.4, 0.4)

    def pil_jitter() -> Image.Image:
        im = pil
        for which, f in cj.params((size, size), gen):
            im = (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color)[which](
                im
            ).enhance(f)
        return im

    out.add("ColorJitter 0.4,0.4,0.4", lambda: cj(img, gen), pil_jitter, "ImageEnhance x3")
    g1, g3 = Grayscale(1), Grayscale(3)
    out.add("Grayscale(1)", lambda: g1(img, gen), lambda: pil.convert("L"), "convert('L')")
    out.add(
        "  raw cv2.cvtColor RGB2GRAY",
        lambda: cv2.cvtColor(img, cv2.COLOR_RGB2GRAY),
        lambda: pil.convert("L"),
        "convert('L') (the op's ceiling)",
    )
    out.add(
        "Grayscale(3)",
        lambda: g3(img, gen),
        lambda: pil.convert("L").convert("RGB"),
        "convert('L').convert('RGB')",
    )
    return out


def _chain_cases(
    size: int, img: np.ndarray, pil: Image.Image, gen: np.random.Generator
) -> list[Case]:
    """Normalize and the seed-000 chain."""
    out = _Cases()
    nz = Normalize(0.5, 0.5, layout="CHW")

    def numpy_norm() -> np.ndarray:  # seed 000's code 2
        x = img.transpose(2, 0, 1).astype(np.float32) / 255
        for c in range(3):
            x[c] = (x[c] - 0.5) / 0.5
        return x

    out.add("Normalize CHW float32", lambda: nz(img, gen), numpy_norm, "NumPy, seed-000 code")
    chain = seed000_train(size)
    big = int(size * 128 / 112)

    def pil_chain() -> np.ndarray:  # seed 000's code 1 without torch: PIL resize, crop, flip, NumPy
        im = pil.resize((big, big), BILINEAR)
        t, left = int(gen.integers(0, big - size + 1)), int(gen.integers(0, big - size + 1))
        im = im.crop((left, t, left + size, t + size))
        if gen.random() < 0.5:
            im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        x = np.asarray(im).transpose(2, 0, 1).astype(np.float32) / 255
        return (x - 0.5) / 0.5

    out.add(
        f"seed000 chain ({size}->{big}->{size})",
        lambda: chain(img, gen),
        pil_chain,
        "PIL resize/crop/flip + NumPy",
    )
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="short rounds, for a smoke run")
    ap.add_argument("--sizes", type=int, nargs="+", default=[112, 224])
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cv2.setNumThreads(1)
    seconds, rounds = (0.03, 2) if args.quick else (0.25, 3)
    print(
        f"one core (cv2.setNumThreads(1)); OpenCV {cv2.__version__}, Pillow {Image.__version__}, NumPy {np.__version__}"
    )
    print(f"{'op':<34}{'size':>6}{'stoker img/s':>14}{'ref img/s':>12}{'ratio':>8}  reference")
    worst: list[float] = []
    for size in args.sizes:
        for name, ours, ref, what in cases(size):
            r_ours, r_ref = compare(ours, ref, seconds, rounds)
            ratio = r_ours / r_ref
            if not name.startswith("  raw"):  # reference rows are not stoker ops
                worst.append(ratio)
            print(
                f"{name:<34}{size:>6}{r_ours:>14,.0f}{r_ref:>12,.0f}{ratio:>7.1f}x  {what}",
                flush=True,
            )
    geo = math.exp(sum(math.log(r) for r in worst) / len(worst))
    print(f"geometric mean ratio {geo:.1f}x; lowest {min(worst):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
