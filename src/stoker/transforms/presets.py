"""Ready-made chains for the recipes users ask for; ``get_preset(name)`` looks one up by name.

==================  ==========================================================================
name                chain
==================  ==========================================================================
``seed000``         Resize(int(s·128/112)) square, RandomCrop(s), HorizontalFlip, Normalize(0.5, 0.5)
``seed000-uint8``   the same without Normalize (uint8 batches; normalise on the GPU)
``imagenet``        RandomResizedCrop(s), HorizontalFlip (uint8)
``imagenet-eval``   Resize(int(s·256/224), shorter side), CenterCrop(s) (uint8)
``kanji``           one geometric (Rotate 15°, Shear 0.2, ScaleTranslate, SineWarp) then one filter
                    (GaussianBlur 0.5–1.2, Sharpen, Smooth): the seed-002 distortions
``none``            identity (``Compose([])``)
==================  ==========================================================================
"""

from __future__ import annotations

from stoker.transforms.color import Normalize
from stoker.transforms.compose import Compose, RandomChoice
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

__all__ = [
    "PRESETS",
    "get_preset",
    "imagenet_eval",
    "imagenet_train",
    "kanji_distort",
    "seed000_train",
]


def _check_size(size: int, owner: str) -> int:
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError(f"{owner}: size must be a positive int, got {size!r}")
    return size


def seed000_train(size: int = 128, *, normalize: bool = True) -> Compose:
    """The seed-000 face-training chain: resize to ``int(size·128/112)`` square (146 for the
    seed's 128: ``int(128·128/112)``), random crop ``size``, flip with p=0.5, then (unless
    ``normalize=False``) ``(x/255 - 0.5)/0.5`` as float32."""
    size = _check_size(size, "seed000_train")
    big = int(size * 128 / 112)
    steps = [Resize((big, big)), RandomCrop(size), HorizontalFlip(0.5)]
    if normalize:
        steps.append(Normalize(0.5, 0.5))
    return Compose(steps)


def imagenet_train(size: int = 224) -> Compose:
    """RandomResizedCrop(size) and a horizontal flip, uint8."""
    size = _check_size(size, "imagenet_train")
    return Compose([RandomResizedCrop(size), HorizontalFlip(0.5)])


def imagenet_eval(size: int = 224) -> Compose:
    """Resize the shorter side to ``int(size·256/224)`` and centre-crop ``size``, uint8."""
    size = _check_size(size, "imagenet_eval")
    return Compose([Resize(int(size * 256 / 224), shorter_side=True), CenterCrop(size)])


def kanji_distort(size: int = 64) -> Compose:
    """The seed-002 distortions for ``size``×``size`` images: one geometric op, then one filter.

    ScaleTranslate's sides scale with ``size`` (25–62 pixels at 64).
    """
    size = _check_size(size, "kanji_distort")
    lo = max(1, round(25 * size / 64))
    hi = max(lo + 1, min(size + 1, round(63 * size / 64)))
    geometric = RandomChoice(
        [Rotate(15), Shear(0.2, 0.2), ScaleTranslate(lo, hi), SineWarp((0.15, 0.2))]
    )
    filters = RandomChoice([GaussianBlur((0.5, 1.2)), Sharpen(), Smooth()])
    return Compose([geometric, filters])


PRESETS = ("imagenet", "imagenet-eval", "kanji", "none", "seed000", "seed000-uint8")


def get_preset(name: str, *, size: int | None = None) -> Compose:
    """The preset chain called ``name`` (see the module docstring); ``size`` overrides the
    preset's output size."""
    kw: dict[str, int] = {} if size is None else {"size": size}
    if name == "seed000":
        return seed000_train(128 if size is None else size)
    if name == "seed000-uint8":
        return seed000_train(128 if size is None else size, normalize=False)
    if name == "imagenet":
        return imagenet_train(**kw)
    if name == "imagenet-eval":
        return imagenet_eval(**kw)
    if name == "kanji":
        return kanji_distort(**kw)
    if name == "none":
        return Compose([])
    raise ValueError(f"unknown transform preset {name!r}; choose one of {', '.join(PRESETS)}")
