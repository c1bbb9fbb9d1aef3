"""Layer 1: ndarray -> ndarray transforms with an explicit rng."""

from stoker.transforms.base import Transform

__all__ = ["Transform"]
