"""The transform contract.

A transform maps one sample's uint8 HWC (or HW) array to another array:

- ``t(img, rng) -> ndarray``: all randomness comes from ``rng``, a ``numpy.random.Generator``
  derived from (seed, epoch, global index) by the loader, so the same sample is augmented the
  same way in whichever process does the work;
- ``t.output_spec(in_spec) -> ArraySpec``: the shape and dtype it returns for inputs of
  ``in_spec`` (``None`` dimensions for "varies"), so the loader can allocate batch slots once
  and refuse a chain that cannot fit them before any data flows.

Transforms are module-level, frozen, picklable objects: they cross process boundaries.
"""

from __future__ import annotations

import abc

import numpy as np

from stoker._core.specs import ArraySpec

__all__ = ["Transform"]


class Transform(abc.ABC):
    @abc.abstractmethod
    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray: ...

    @abc.abstractmethod
    def output_spec(self, in_spec: ArraySpec) -> ArraySpec: ...

    def __repr__(self) -> str:
        fields = getattr(self, "__dataclass_fields__", None)
        if fields:
            args = ", ".join(f"{k}={getattr(self, k)!r}" for k in fields)
            return f"{type(self).__name__}({args})"
        return f"{type(self).__name__}()"
