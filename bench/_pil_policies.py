"""The augmentation policies on PIL images: the reference that stoker's policies are held to
(``tests/transforms/test_policies.py``) and timed against (``bench/bench_policies.py``).

Written from the published definitions, not imported (torchvision does not import beside the
CPU build of torch these machines install):

- torchvision's op table for ``RandAugment``, ``TrivialAugmentWide`` and
  ``AutoAugment(AutoAugmentPolicy.IMAGENET)``: the ops, their magnitude ranges over
  ``num_magnitude_bins`` bins (31; 10 for AutoAugment), which magnitudes take a random sign,
  nearest interpolation and fill 0 (PIL's default fill);
- timm's RandAugment ops and level functions (``rand-m9-mstd0.5-inc1``: the level ``m`` out of
  10, Gaussian noise on it, the op set whose strength grows with the level).

Each op is one call of PIL's ``ImageOps``, ``ImageEnhance``, ``Image.transform`` or
``Image.rotate`` on a PIL image, the functions torchvision's PIL backend and timm call, with no
NumPy round trip between ops. The policies draw from a ``random.Random``; only the ops and
their magnitudes are compared with stoker's, never the draws themselves.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

NEAREST = Image.Resampling.NEAREST
BILINEAR = Image.Resampling.BILINEAR
AFFINE = Image.Transform.AFFINE

#: torchvision's RandAugment and TrivialAugmentWide op list, in its order
TORCHVISION_OPS = (
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
)

#: AutoAugment's ImageNet policy: 25 sub-policies of two (op, probability, magnitude bin)
AUTOAUGMENT_IMAGENET = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
    (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.4, 0), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)

#: timm's RandAugment op sets: the default one and the increasing one (``inc1``)
TIMM_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
TIMM_INCREASING_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
#: timm's training recipe fills with the ImageNet mean in 0-255 (its img_mean hparam)
TIMM_FILL = (124, 116, 104)


def _bins(lo: float, hi: float, n: int) -> tuple[float, ...]:
    """``torch.linspace(lo, hi, n)``: float32 values."""
    return tuple(float(v) for v in np.linspace(lo, hi, n).astype(np.float32))


@functools.lru_cache(maxsize=64)
def torchvision_space(
    num_bins: int, hw: tuple[int, int], *, wide: bool = False, invert: bool = False
) -> dict[str, tuple[tuple[float, ...] | None, bool]]:
    """op -> (magnitude per bin, or None for an op without one; whether its sign is drawn),
    for an image of ``hw`` (height, width). ``wide``: TrivialAugmentWide's ranges;
    ``invert``: AutoAugment's table, which adds Invert."""
    h, w = hw
    if wide:
        shear, tx, ty, rot, enhance, steps = 0.99, 32.0, 32.0, 135.0, 0.99, 6
    else:
        shear, tx, ty, rot, enhance, steps = 0.3, 150 / 331 * w, 150 / 331 * h, 30.0, 0.9, 4
    # torch.round: halves to even, as np.round
    posterize = tuple(
        float(8 - int(np.round(b / ((num_bins - 1) / steps)))) for b in range(num_bins)
    )
    space: dict[str, tuple[tuple[float, ...] | None, bool]] = {
        "Identity": (None, False),
        "ShearX": (_bins(0.0, shear, num_bins), True),
        "ShearY": (_bins(0.0, shear, num_bins), True),
        "TranslateX": (_bins(0.0, tx, num_bins), True),
        "TranslateY": (_bins(0.0, ty, num_bins), True),
        "Rotate": (_bins(0.0, rot, num_bins), True),
        "Brightness": (_bins(0.0, enhance, num_bins), True),
        "Color": (_bins(0.0, enhance, num_bins), True),
        "Contrast": (_bins(0.0, enhance, num_bins), True),
        "Sharpness": (_bins(0.0, enhance, num_bins), True),
        "Posterize": (posterize, False),
        "Solarize": (_bins(255.0, 0.0, num_bins), False),
        "AutoContrast": (None, False),
        "Equalize": (None, False),
    }
    if invert:
        space["Invert"] = (None, False)
    return space


def apply_op(
    img: Image.Image, name: str, magnitude: float, *, fill: Any = None, resample: Any = NEAREST
) -> Image.Image:
    """torchvision's op ``name`` at ``magnitude`` (already signed), on a PIL image."""
    opts = {} if fill is None else {"fillcolor": fill}
    if name == "Identity":
        return img
    if name == "ShearX":
        return img.transform(img.size, AFFINE, (1, magnitude, 0, 0, 1, 0), resample, **opts)
    if name == "ShearY":
        return img.transform(img.size, AFFINE, (1, 0, 0, magnitude, 1, 0), resample, **opts)
    if name == "TranslateX":
        return img.transform(img.size, AFFINE, (1, 0, -int(magnitude), 0, 1, 0), resample, **opts)
    if name == "TranslateY":
        return img.transform(img.size, AFFINE, (1, 0, 0, 0, 1, -int(magnitude)), resample, **opts)
    if name == "Rotate":
        return img.rotate(magnitude, resample, **opts)
    if name == "Brightness":
        return ImageEnhance.Brightness(img).enhance(1.0 + magnitude)
    if name == "Color":
        return ImageEnhance.Color(img).enhance(1.0 + magnitude)
    if name == "Contrast":
        return ImageEnhance.Contrast(img).enhance(1.0 + magnitude)
    if name == "Sharpness":
        return ImageEnhance.Sharpness(img).enhance(1.0 + magnitude)
    if name == "Posterize":
        return ImageOps.posterize(img, int(magnitude))
    if name == "Solarize":
        return ImageOps.solarize(img, magnitude)
    if name == "AutoContrast":
        return ImageOps.autocontrast(img)
    if name == "Equalize":
        return ImageOps.equalize(img)
    if name == "Invert":
        return ImageOps.invert(img)
    raise ValueError(f"unknown op {name!r}")


class RandAugment:
    """torchvision's ``RandAugment(num_ops, magnitude, num_magnitude_bins, fill)`` on PIL
    images: ``num_ops`` ops drawn uniformly with replacement, each at bin ``magnitude`` with a
    random sign where the op takes one."""

    def __init__(
        self,
        num_ops: int = 2,
        magnitude: int = 9,
        num_magnitude_bins: int = 31,
        fill: Any = None,
        rnd: random.Random | None = None,
    ) -> None:
        self.num_ops, self.magnitude, self.bins, self.fill = (
            num_ops,
            magnitude,
            num_magnitude_bins,
            fill,
        )
        self.rnd = rnd or random.Random()

    def __call__(self, img: Image.Image) -> Image.Image:
        space = torchvision_space(self.bins, (img.height, img.width))
        for _ in range(self.num_ops):
            name = TORCHVISION_OPS[self.rnd.randrange(len(TORCHVISION_OPS))]
            values, signed = space[name]
            m = values[self.magnitude] if values is not None else 0.0
            if signed and self.rnd.randrange(2):
                m = -m
            img = apply_op(img, name, m, fill=self.fill)
        return img


class TrivialAugmentWide:
    """torchvision's ``TrivialAugmentWide(num_magnitude_bins, fill)``: one op drawn uniformly,
    at a bin drawn uniformly, with a random sign where the op takes one."""

    def __init__(
        self, num_magnitude_bins: int = 31, fill: Any = None, rnd: random.Random | None = None
    ) -> None:
        self.bins, self.fill = num_magnitude_bins, fill
        self.rnd = rnd or random.Random()

    def __call__(self, img: Image.Image) -> Image.Image:
        space = torchvision_space(self.bins, (img.height, img.width), wide=True)
        name = TORCHVISION_OPS[self.rnd.randrange(len(TORCHVISION_OPS))]
        values, signed = space[name]
        m = values[self.rnd.randrange(len(values))] if values is not None else 0.0
        if signed and self.rnd.randrange(2):
            m = -m
        return apply_op(img, name, m, fill=self.fill)


class AutoAugment:
    """torchvision's ``AutoAugment(AutoAugmentPolicy.IMAGENET, fill)``: a sub-policy drawn
    uniformly; each of its two ops runs with its probability, at its bin of 10, with a random
    sign where the op takes one."""

    def __init__(self, fill: Any = None, rnd: random.Random | None = None) -> None:
        self.fill = fill
        self.rnd = rnd or random.Random()

    def __call__(self, img: Image.Image) -> Image.Image:
        space = torchvision_space(10, (img.height, img.width), invert=True)
        policy = AUTOAUGMENT_IMAGENET[self.rnd.randrange(len(AUTOAUGMENT_IMAGENET))]
        for name, p, b in policy:
            if self.rnd.random() <= p:
                values, signed = space[name]
                m = values[b] if values is not None and b is not None else 0.0
                if signed and self.rnd.randrange(2) == 0:
                    m = -m
                img = apply_op(img, name, m, fill=self.fill)
        return img


# ---------------------------------------------------------------------------- timm
def timm_arg(name: str, level: float, negate: bool = False) -> float | None:
    """timm's argument of op ``name`` at ``level`` (0 to 10, after its noise and clip);
    ``negate``: the draw that flips the sign of a signed op. ``None``: the op takes none."""
    f = level / 10.0
    sign = -1.0 if negate else 1.0
    if name in ("AutoContrast", "Equalize", "Invert"):
        return None
    if name == "Rotate":
        return sign * f * 30.0
    if name in ("ShearX", "ShearY"):
        return sign * f * 0.3
    if name in ("TranslateXRel", "TranslateYRel"):
        return sign * f * 0.45
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return f * 1.8 + 0.1
    if name.endswith("Increasing") and not name.startswith(("Posterize", "Solarize")):
        return max(0.1, 1.0 + sign * f * 0.9)
    if name == "Posterize":
        return float(int(f * 4))
    if name == "PosterizeIncreasing":
        return float(4 - int(f * 4))
    if name == "Solarize":
        return float(int(f * 256))
    if name == "SolarizeIncreasing":
        return float(256 - int(f * 256))
    if name == "SolarizeAdd":
        return float(int(f * 110))
    raise ValueError(f"unknown timm op {name!r}")


def timm_apply(
    img: Image.Image,
    name: str,
    arg: float | None,
    *,
    fill: Any = TIMM_FILL,
    resample: Any = BILINEAR,
) -> Image.Image:
    """timm's op ``name`` with argument ``arg`` (:func:`timm_arg`) on a PIL image."""
    opts = {"fillcolor": fill, "resample": resample}
    base = name.removesuffix("Increasing")
    if arg is None:
        return apply_op(img, base, 0.0)
    if base == "Rotate":
        return img.rotate(arg, **opts)
    if base == "ShearX":
        return img.transform(img.size, AFFINE, (1, arg, 0, 0, 1, 0), **opts)
    if base == "ShearY":
        return img.transform(img.size, AFFINE, (1, 0, 0, arg, 1, 0), **opts)
    if base == "TranslateXRel":
        return img.transform(img.size, AFFINE, (1, 0, arg * img.width, 0, 1, 0), **opts)
    if base == "TranslateYRel":
        return img.transform(img.size, AFFINE, (1, 0, 0, 0, 1, arg * img.height), **opts)
    if base == "Posterize":
        if arg >= 8:
            return img
        if arg < 1:  # keep no bit: black (recent Pillow refuses posterize(img, 0))
            return img.point([0] * 256 * len(img.getbands()))
        return ImageOps.posterize(img, int(arg))
    if base == "Solarize":
        return ImageOps.solarize(img, arg)
    if base == "SolarizeAdd":
        lut = [min(255, i + int(arg)) if i < 128 else i for i in range(256)]
        return img.point(lut * len(img.getbands()))
    enhance = {
        "Color": ImageEnhance.Color,
        "Contrast": ImageEnhance.Contrast,
        "Brightness": ImageEnhance.Brightness,
        "Sharpness": ImageEnhance.Sharpness,
    }[base]
    return enhance(img).enhance(arg)
