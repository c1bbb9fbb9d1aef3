"""The transform contract.

A transform maps one sample's uint8 HWC (or HW) array to another array:

- ``t(img, rng) -> ndarray``: all randomness comes from ``rng``, a ``numpy.random.Generator``
  the loader derives with ``stoker._core.seeding.sample_rng(seed, epoch, index)`` (``index``
  is the sample's global position), so the same sample is augmented the same way in whichever
  process does the work, and differently in each epoch. Transforms never make their own
  generator and never touch NumPy's or Python's global random state;
- ``t.output_spec(in_spec) -> ArraySpec``: the shape and dtype it returns for inputs of
  ``in_spec`` (``None`` dimensions for "varies"), so the loader can allocate batch slots once
  and refuse a chain that cannot fit them before any data flows. It is exact whenever it can
  be computed from ``in_spec``;
- ``t.decode_hint(full_hw) -> (min_h, min_w) | None`` (optional, default ``None``): for a
  transform that begins by shrinking the image, the smallest decoded size that gives the same
  result as decoding at full size ``full_hw``; the loader may then ask the JPEG decoder for a
  reduced-scale (DCT-scaled) decode whose height and width are both at least that.

- ``t.apply_targets(img, targets, rng) -> ndarray``: the same op on ``img`` that also moves the
  sample's boxes, points and masks (a :class:`~stoker.transforms.targets.Targets`, changed in
  place), with the same draws from ``rng`` and the same image result as ``t(img, rng)``;
  ``t.moves_geometry`` says what to expect: ``False`` for ops that leave geometry alone (colour,
  filters; the default ``apply_targets`` then calls ``t(img, rng)``), ``True`` for ops that
  implement ``apply_targets``, ``None`` when unknown (a plain function): refused, before data
  flows, for a sample with geometric fields. ``t.check_targets(kinds)`` raises ``SpecError``
  when the op cannot carry a kind (``"boxes"``, ``"points"``, ``"mask"``).

Transforms never write into their input; they may return a view of it (a crop does).
They are module-level, frozen, picklable objects: they cross process boundaries.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from stoker._core.errors import SpecError
from stoker._core.specs import ArraySpec
from stoker.transforms._util import check_image, image_spec_dims

if TYPE_CHECKING:
    from stoker.transforms.targets import Targets

__all__ = ["Transform"]


class Transform(abc.ABC):
    """Base of every transform: ``__call__(img, rng)`` and ``output_spec(in_spec)``."""

    #: Built-in ops are tested against their declared specs; ``Compose`` checks the others
    #: at call time.
    _builtin: ClassVar[bool] = False

    @abc.abstractmethod
    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...

    @abc.abstractmethod
    def output_spec(self, in_spec: ArraySpec) -> ArraySpec: ...

    #: How the op moves geometry (see the module docstring): False, True or None (unknown).
    #: A class attribute on the built-in ops; an instance field where it is the user's word
    #: (``as_transform(fn, moves_geometry=False)``).
    moves_geometry: bool | None = None

    def apply_targets(
        self, img: np.ndarray, targets: Targets, rng: np.random.Generator
    ) -> np.ndarray:
        """The op on ``img`` and, in place, on ``targets`` (see the module docstring).

        This default serves ops that leave geometry alone, and any op when there is nothing
        to move; ops that move geometry override it."""
        if self.moves_geometry is False or targets.empty:
            return self(img, rng)
        raise SpecError(
            f"{self!r} does not say how it moves boxes, points or masks; set "
            "moves_geometry=False on it if it leaves them alone"
        )

    def check_targets(self, kinds: frozenset[str]) -> None:
        """Raise ``SpecError`` naming the op when it cannot carry one of ``kinds``.

        An op passes when it leaves geometry alone (``moves_geometry=False``) or implements
        ``apply_targets``; an op that can carry only some kinds overrides this."""
        if (
            kinds
            and self.moves_geometry is not False
            and type(self).apply_targets is Transform.apply_targets
        ):
            raise SpecError(
                f"{self!r} cannot carry {', '.join(sorted(kinds))}: it does not say how it "
                "moves them (moves_geometry=False marks an op that leaves them alone)"
            )

    def decode_hint(self, full_hw: tuple[int, int]) -> tuple[int, int] | None:
        """Smallest decoded (h, w) that loses nothing for this transform; ``None``: full size."""
        return None

    def __repr__(self) -> str:
        fields = getattr(self, "__dataclass_fields__", None)
        if fields:
            args = ", ".join(f"{k}={getattr(self, k)!r}" for k in fields)
            return f"{type(self).__name__}({args})"
        return f"{type(self).__name__}()"


class _SameSpec(Transform):
    """An op that returns an image of its input's spec (HW or HWC; uint8 only with ``_uint8``)."""

    _uint8: ClassVar[bool] = False

    def _check_input(self, img: np.ndarray) -> None:
        """``check_image``, then (with ``_uint8``) the dtype."""
        owner = type(self).__name__
        check_image(img, owner)
        if self._uint8 and img.dtype != np.uint8:
            raise TypeError(f"{owner}: expects uint8, got {img.dtype}")

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        owner = type(self).__name__
        image_spec_dims(in_spec, owner)
        if self._uint8 and in_spec.dtype != "uint8":
            raise SpecError(f"{owner}: expects uint8 input, got {in_spec.describe()}")
        return in_spec
