"""Frozen, picklable descriptions of arrays that stages declare before any data flows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker._core.errors import SpecError

__all__ = ["ArraySpec"]


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one sample's array. ``None`` in ``shape`` means "varies per sample".

    >>> ArraySpec((112, 112, 3), "uint8").nbytes
    37632
    """

    shape: tuple[int | None, ...]
    dtype: str = "uint8"

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        for d in shape:
            if d is not None and (not isinstance(d, (int, np.integer)) or d < 0):
                raise SpecError(f"ArraySpec shape entries must be ints >= 0 or None, got {shape!r}")
        object.__setattr__(self, "shape", tuple(None if d is None else int(d) for d in shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)

    @property
    def fixed(self) -> bool:
        """True when every dimension is known, so a buffer can be allocated for it."""
        return all(d is not None for d in self.shape)

    @property
    def nbytes(self) -> int:
        if not self.fixed:
            raise SpecError(f"{self} has unknown dimensions; its size is not fixed")
        n = np.dtype(self.dtype).itemsize
        for d in self.shape:
            n *= d  # type: ignore[operator]
        return n

    def accepts(self, arr: np.ndarray) -> bool:
        """True when ``arr`` matches this spec (``None`` dimensions match anything)."""
        if arr.dtype != np.dtype(self.dtype) or arr.ndim != len(self.shape):
            return False
        return all(d is None or d == s for d, s in zip(self.shape, arr.shape))

    def check(self, arr: np.ndarray, *, what: str = "array") -> None:
        """Raise :class:`SpecError` naming both sides when ``arr`` does not match."""
        if not self.accepts(arr):
            raise SpecError(
                f"{what}: got {tuple(arr.shape)} {arr.dtype}, expected {self.describe()}"
            )

    def describe(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"({dims}) {self.dtype}"

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, d: dict) -> ArraySpec:
        return cls(tuple(d["shape"]), d["dtype"])
