"""The augmentation policies of the ImageNet recipes on uint8 images: torchvision's
``RandAugment``, ``TrivialAugmentWide`` and ``AutoAugment("imagenet")``, and timm's RandAugment
strings (``RandAugment.from_timm("rand-m9-mstd0.5-inc1")``).

An op is a name and its argument as torchvision or timm hands it to PIL; ``params(hw, rng)``
gives an image's ops, ``run(img, name, arg)`` applies one (:mod:`stoker.transforms._augops`).
Every draw comes from the sample's generator; the geometric ops move boxes, points and masks.
docs/policies.md maps the torchvision and timm names onto these.
"""

from __future__ import annotations

import math
import re
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from stoker.transforms._augops import apply_op, move_targets
from stoker.transforms._geom import check_affine_interp, check_frame
from stoker.transforms._util import check_fill
from stoker.transforms.base import _SameSpec

if TYPE_CHECKING:
    from stoker.transforms.targets import Targets

__all__ = ["AutoAugment", "RandAugment", "TrivialAugmentWide"]

#: the op lists, in torchvision's and timm's order
OPS = {
    "torchvision": tuple(
        "Identity ShearX ShearY TranslateX TranslateY Rotate Brightness Color Contrast "
        "Sharpness Posterize Solarize AutoContrast Equalize".split()
    ),
    "timm": tuple(
        "AutoContrast Equalize Invert Rotate Posterize Solarize SolarizeAdd Color Contrast "
        "Brightness Sharpness ShearX ShearY TranslateXRel TranslateYRel".split()
    ),
}
_GROWS = ("Posterize", "Solarize", "Color", "Contrast", "Brightness", "Sharpness")
OPS["timm-increasing"] = tuple(n + "Increasing" if n in _GROWS else n for n in OPS["timm"])

_ENHANCE = frozenset({"brightness", "color", "contrast", "sharpness"})
# torchvision: the top of each op's magnitude range (RandAugment and AutoAugment,
# TrivialAugmentWide); a translation's 0 stands for 150/331 of the image's side
_TV_TOP = {"shear": (0.3, 0.99), "translate": (0.0, 32.0), "rotate": (30.0, 135.0)}


def _kind(name: str) -> str:
    """The kernel of op ``name`` (:mod:`stoker.transforms._augops`): ``"TranslateXRel"`` ->
    ``"translate_x"``, ``"SharpnessIncreasing"`` -> ``"sharpness"``."""
    base = name.removesuffix("Increasing").removesuffix("Rel")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", base).lower()


# timm: name -> (base, slope, how) at level fraction f = level / 10: "signed" base ± slope·f
# (the sign drawn), "up" base + slope·f, "int" base + int(slope·f), "down" base - int(slope·f)
_TIMM = {
    "Rotate": (0.0, 30.0, "signed"),
    "ShearX": (0.0, 0.3, "signed"),
    "ShearY": (0.0, 0.3, "signed"),
    "TranslateXRel": (0.0, 0.45, "signed"),
    "TranslateYRel": (0.0, 0.45, "signed"),
    "Posterize": (0.0, 4.0, "int"),
    "PosterizeIncreasing": (4.0, 4.0, "down"),
    "Solarize": (0.0, 256.0, "int"),
    "SolarizeIncreasing": (256.0, 256.0, "down"),
    "SolarizeAdd": (0.0, 110.0, "int"),
}
for _n in ("Color", "Contrast", "Brightness", "Sharpness"):
    _TIMM[_n] = (0.1, 1.8, "up")
    _TIMM[_n + "Increasing"] = (1.0, 0.9, "signed")

# AutoAugment's ImageNet policy: 25 sub-policies of two "op probability bin" ("-": no bin)
_IMAGENET = [
    tuple((op, float(p), None if b == "-" else int(b)) for op, p, b in zip(*[iter(s.split())] * 3))
    for s in """Posterize .4 8 Rotate .6 9|Solarize .6 5 AutoContrast .6 -
    |Equalize .8 - Equalize .6 -|Posterize .6 7 Posterize .6 6|Equalize .4 - Solarize .2 4
    |Equalize .4 - Rotate .8 8
    |Solarize .6 3 Equalize .6 -|Posterize .8 5 Equalize 1 -|Rotate .2 3 Solarize .6 8
    |Equalize .6 - Posterize .4 6|Rotate .8 8 Color .4 0|Rotate .4 9 Equalize .6 -
    |Equalize 0 - Equalize .8 -|Invert .6 - Equalize 1 -|Color .6 4 Contrast 1 8
    |Rotate .8 8 Color 1 2|Color .8 8 Solarize .8 7|Sharpness .4 7 Invert .6 -
    |ShearX .6 5 Equalize 1 -|Color .4 0 Equalize .6 -|Equalize .4 - Solarize .2 4
    |Solarize .6 5 AutoContrast .6 -|Invert .6 - Equalize 1 -|Color .4 0 Contrast 1 8
    |Equalize .8 - Equalize .6 -""".split("|")
]

Arg = float | None
Applied = list[tuple[str, Arg]]


def _torchvision_arg(
    name: str, level: float, bins: int, hw: tuple[int, int], wide: bool, negate: bool
) -> Arg:
    """torchvision's magnitude of ``name`` at ``level`` (a bin) of ``bins``: the bin's value of
    ``linspace(0, top, bins)``, signed where the op takes a sign."""
    kind = _kind(name)
    if kind == "posterize":  # bits kept: 8 down to 4 (wide: 2), rounded halves to even
        return 8.0 - float(np.round(level / ((bins - 1) / (6 if wide else 4))))
    if kind == "solarize":  # the threshold, 255 down to 0
        return float(np.float32(255.0 - 255.0 * level / (bins - 1)))
    ranges = _TV_TOP.get(kind.split("_")[0], (0.9, 0.99) if kind in _ENHANCE else None)
    if ranges is None:
        return None
    top = ranges[wide] or 150 / 331 * hw[kind == "translate_x"]
    m = float(np.float32(top * level / (bins - 1)))  # torch.linspace's float32 values
    return -m if negate else m


def _timm_arg(name: str, level: float, negate: bool) -> Arg:
    """timm's argument of ``name`` at ``level`` (of 10), from ``_TIMM``."""
    if name not in _TIMM:
        return None
    base, slope, how = _TIMM[name]
    f = level / 10.0
    if how == "signed":
        arg = base - slope * f if negate else base + slope * f
        return max(0.1, arg) if _kind(name) in _ENHANCE else arg
    if how == "up":
        return base + slope * f
    return base + int(slope * f) if how == "int" else base - int(slope * f)


class _Policy(_SameSpec):
    """What the policies share: the ops, their targets, the spec. A subclass (a frozen
    dataclass with ``fill`` and ``interpolation`` fields) says which ops an image gets
    (``params``) and in which space their arguments are (``space``)."""

    _builtin = True
    moves_geometry = True
    _uint8 = True
    space: ClassVar[str] = "torchvision"  # "torchvision", "wide" or "timm"
    fill: Any
    interpolation: str

    def _check_fields(self) -> None:
        owner = type(self).__name__
        object.__setattr__(self, "fill", check_fill(self.fill, owner))
        check_affine_interp(self.interpolation, owner)

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> Applied:
        """``[(op name, argument), ...]``: the ops an image of ``hw`` gets, in order."""
        raise NotImplementedError

    def kernel(self, name: str, arg: Arg, hw: tuple[int, int]) -> tuple[str, float]:
        """The kernel and its value (:mod:`stoker.transforms._augops`) for op ``name`` at
        ``arg``: torchvision's enhance magnitudes become ``1 + m``, its translations whole
        pixels; timm's relative translations move by ``-arg`` times the side, as its PIL
        matrix does."""
        kind = _kind(name)
        v = 0.0 if arg is None else float(arg)
        if self.space == "timm":
            if name.endswith("Rel"):
                v = -v * hw[kind == "translate_x"]
        elif kind in _ENHANCE:
            v = 1.0 + v
        elif kind.startswith("translate"):
            v = float(int(v))
        return kind, v

    def run(self, img: np.ndarray, name: str, arg: Arg) -> np.ndarray:
        """Op ``name`` at ``arg`` (as :meth:`params` gives it) on ``img``."""
        kind, value = self.kernel(name, arg, img.shape[:2])
        return apply_op(img, kind, value, interpolation=self.interpolation, fill=self.fill)

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        self._check_input(img)
        for name, arg in self.params(img.shape[:2], rng):
            img = self.run(img, name, arg)
        return img

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        self._check_input(img)
        check_frame(img, targets, type(self).__name__)
        for name, arg in self.params(img.shape[:2], rng):
            move_targets(targets, *self.kernel(name, arg, img.shape[:2]), img.shape[:2])
            img = self.run(img, name, arg)
        return img


@dataclass(frozen=True)
class RandAugment(_Policy):
    """torchvision's ``RandAugment``: ``num_ops`` ops drawn uniformly with replacement from
    the 14 of ``OPS["torchvision"]``, each at bin ``magnitude`` of ``num_magnitude_bins``
    with a random sign where the op takes one; geometric ops sample with ``interpolation``
    and fill with ``fill``.

    The keywords make timm's variant (:meth:`from_timm`): ``ops`` ``"timm"`` or
    ``"timm-increasing"`` (timm's op sets and level functions, ``magnitude`` out of
    ``num_magnitude_bins - 1`` = 10), ``p`` each op's probability, ``magnitude_std`` the
    standard deviation of Gaussian noise on the level (``inf``: uniform in ``[0,
    magnitude]``), ``magnitude_max`` the level's upper clip (default ``num_magnitude_bins -
    1``).
    """

    num_ops: int = 2
    magnitude: float = 9
    num_magnitude_bins: int = 31
    fill: Any = 0
    _: KW_ONLY
    interpolation: str = "nearest"
    ops: str = "torchvision"
    p: float = 1.0
    magnitude_std: float = 0.0
    magnitude_max: float | None = None

    def __post_init__(self) -> None:
        self._check_fields()
        bins, tv = self.num_magnitude_bins, self.ops == "torchvision"
        if self.ops not in OPS or not (isinstance(self.num_ops, int) and self.num_ops >= 0):
            raise ValueError(f"RandAugment: ops must be one of {sorted(OPS)}, num_ops an int >= 0")
        if not (isinstance(bins, int) and bins >= 2) or (tv and not 0 <= self.magnitude < bins):
            raise ValueError("RandAugment: need num_magnitude_bins >= 2, magnitude a bin of them")
        if not 0.0 <= self.p <= 1.0 or not self.magnitude_std >= 0:
            raise ValueError("RandAugment: p must lie in [0, 1] and magnitude_std be >= 0")

    @property
    def space(self) -> str:  # type: ignore[override]
        return "torchvision" if self.ops == "torchvision" else "timm"

    @classmethod
    def from_timm(
        cls, config: str, *, fill: Any = (124, 116, 104), interpolation: str = "bilinear"
    ) -> RandAugment:
        """timm's ``rand_augment_transform(config)``: ``"rand"`` then ``-``-separated
        ``m<int>`` (level, default 10), ``n<int>`` (ops per image, 2), ``mstd<float>`` (level
        noise; above 100: uniform), ``mmax<int>`` (the level's clip, 10), ``inc<0|1>`` (the
        increasing op set) and ``p<float>`` (each op's probability, 0.5). ``fill``: timm's
        training recipe fills with the ImageNet mean; timm draws bilinear or bicubic per op,
        stoker takes one ``interpolation``."""
        parts = config.split("-")
        if parts[0] != "rand":
            raise ValueError(f"RandAugment.from_timm: expected 'rand-...', got {config!r}")
        kw: dict[str, Any] = {"magnitude": 10.0, "num_ops": 2, "p": 0.5, "ops": "timm"}
        for part in parts[1:]:
            key, val = (re.split(r"(\d.*)", part) + ["", ""])[:2]
            if not val:
                continue
            if key not in ("m", "n", "mstd", "mmax", "inc", "p"):
                raise ValueError(f"RandAugment.from_timm: {part!r} is not supported in {config!r}")
            if key == "mstd":
                kw["magnitude_std"] = math.inf if float(val) > 100 else float(val)
            elif key == "inc":
                kw["ops"] = "timm-increasing" if int(val) else "timm"
            else:
                names = {"m": "magnitude", "n": "num_ops", "mmax": "magnitude_max", "p": "p"}
                kw[names[key]] = int(val) if key == "n" else float(val)
        return cls(num_magnitude_bins=11, fill=fill, interpolation=interpolation, **kw)

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> Applied:
        names = OPS[self.ops]
        n, std = self.num_ops, self.magnitude_std
        u = rng.random(3 * n)  # per op: which, its sign, whether it runs
        noise = None if std == 0 else rng.random(n) if math.isinf(std) else rng.standard_normal(n)
        top = self.num_magnitude_bins - 1 if self.magnitude_max is None else self.magnitude_max
        out: Applied = []
        for i in range(n):
            if self.p < 1.0 and u[3 * i + 2] > self.p:
                continue
            name = names[int(u[3 * i] * len(names))]
            level = float(self.magnitude)
            if noise is not None:
                level = level * noise[i] if math.isinf(std) else level + std * noise[i]
            level = min(max(level, 0.0), top)
            negate = bool(u[3 * i + 1] < 0.5)
            if self.ops == "torchvision":
                arg = _torchvision_arg(name, level, self.num_magnitude_bins, hw, False, negate)
            else:
                arg = _timm_arg(name, level, negate)
            out.append((name, arg))
        return out


@dataclass(frozen=True)
class TrivialAugmentWide(_Policy):
    """torchvision's ``TrivialAugmentWide``: one op drawn uniformly from the 14 of
    ``OPS["torchvision"]``, at a bin drawn uniformly from ``num_magnitude_bins`` of its wide
    range, with a random sign where the op takes one."""

    num_magnitude_bins: int = 31
    fill: Any = 0
    _: KW_ONLY
    interpolation: str = "nearest"

    space: ClassVar[str] = "wide"

    def __post_init__(self) -> None:
        self._check_fields()
        if not (isinstance(self.num_magnitude_bins, int) and self.num_magnitude_bins >= 2):
            raise ValueError("TrivialAugmentWide: num_magnitude_bins must be an int >= 2")

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> Applied:
        u = rng.random(3)  # the op, its bin, its sign
        names = OPS["torchvision"]
        name = names[int(u[0] * len(names))]
        level = float(int(u[1] * self.num_magnitude_bins))
        return [
            (name, _torchvision_arg(name, level, self.num_magnitude_bins, hw, True, u[2] < 0.5))
        ]


@dataclass(frozen=True)
class AutoAugment(_Policy):
    """torchvision's ``AutoAugment(AutoAugmentPolicy.IMAGENET)``: one of the 25 sub-policies
    drawn uniformly; each of its two ops runs with its probability, at its bin of 10, with a
    random sign where the op takes one."""

    policy: str = "imagenet"
    fill: Any = 0
    _: KW_ONLY
    interpolation: str = "nearest"

    def __post_init__(self) -> None:
        self._check_fields()
        if self.policy != "imagenet":
            raise ValueError(f"AutoAugment: only policy='imagenet' is offered, got {self.policy!r}")

    def params(self, hw: tuple[int, int], rng: np.random.Generator) -> Applied:
        u = rng.random(5)  # the sub-policy, whether each op runs, each op's sign
        out: Applied = []
        for k, (name, p, b) in enumerate(_IMAGENET[int(u[0] * len(_IMAGENET))]):
            if u[1 + k] <= p:
                arg = (
                    None if b is None else _torchvision_arg(name, b, 10, hw, False, u[3 + k] < 0.5)
                )
                out.append((name, arg))
        return out
