"""Layer 1: ndarray -> ndarray transforms with an explicit rng.

Ops work on uint8 HWC (or HW) NumPy arrays through OpenCV (imported on first use, not by
``import stoker.transforms``), draw randomness only from the ``numpy.random.Generator`` they
are handed (the loader passes ``stoker._core.seeding.sample_rng(seed, epoch, index)``), and
declare their output with ``output_spec(in_spec)``. All are frozen, picklable dataclasses.

Geometry follows the image: ``t.apply_targets(img, targets, rng)`` gives the image ``t(img,
rng)`` gives and moves a sample's boxes, points and masks (a :class:`Targets`) with it;
``t.check_targets(kinds)`` refuses, before data flows, a chain that cannot carry them.

Decode hint (scale-on-decode): ``decode_hint(t, full_hw)`` (or ``t.decode_hint(full_hw)``)
returns ``(min_h, min_w)`` when the chain begins by shrinking (``Resize``,
``RandomResizedCrop``): the JPEG decoder may then decode at a reduced scale as long as both
sides stay at least that large, and the result is as good as a full-size decode. ``None``
means "decode at full size".

The augmentation policies (``RandAugment``, ``TrivialAugmentWide``, ``AutoAugment``) are in
:mod:`stoker.transforms.policies`; the batch mixers a loader runs on whole batches
(``MixUp``, ``CutMix``, ``MixUpCutMix``, ``Loader(..., mix=...)``) in
:mod:`stoker.transforms.mix`.
"""

from stoker.transforms.base import Transform
from stoker.transforms.color import ColorJitter, Grayscale, Normalize
from stoker.transforms.compose import (
    Compose,
    FnTransform,
    OneOf,
    PerSet,
    RandomApply,
    RandomChoice,
    as_transform,
    decode_hint,
    merge_specs,
)
from stoker.transforms.filters import GaussianBlur, Sharpen, Smooth
from stoker.transforms.geometry import (
    CenterCrop,
    HorizontalFlip,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    Rotate,
    ScaleTranslate,
    Shear,
    SineWarp,
)
from stoker.transforms.mix import CutMix, MixUp, MixUpCutMix
from stoker.transforms.policies import AutoAugment, RandAugment, TrivialAugmentWide
from stoker.transforms.presets import PRESETS, get_preset
from stoker.transforms.targets import MIN_BOX_SIZE, MIN_VISIBILITY, Targets

__all__ = [
    "AutoAugment",
    "CenterCrop",
    "ColorJitter",
    "Compose",
    "CutMix",
    "FnTransform",
    "GaussianBlur",
    "Grayscale",
    "HorizontalFlip",
    "MIN_BOX_SIZE",
    "MIN_VISIBILITY",
    "MixUp",
    "MixUpCutMix",
    "Normalize",
    "OneOf",
    "PRESETS",
    "PerSet",
    "RandAugment",
    "RandomApply",
    "RandomChoice",
    "RandomCrop",
    "RandomResizedCrop",
    "Resize",
    "Rotate",
    "ScaleTranslate",
    "Sharpen",
    "Shear",
    "SineWarp",
    "Smooth",
    "Targets",
    "Transform",
    "TrivialAugmentWide",
    "as_transform",
    "decode_hint",
    "get_preset",
    "merge_specs",
]
