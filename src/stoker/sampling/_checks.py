"""Label and fingerprint helpers of the samplers; the argument checks live in ``stoker._core.checks``."""

from __future__ import annotations

import hashlib

import numpy as np

from stoker._core.checks import check_epoch, check_int, check_rank, check_seed

__all__ = [
    "array_digest",
    "as_counts",
    "as_labels",
    "check_epoch",
    "check_int",
    "check_rank",
    "check_seed",
]


def array_digest(arr: np.ndarray) -> str:
    """A short content hash of an array (for fingerprints: same data, same digest)."""
    a = np.ascontiguousarray(arr)
    h = hashlib.sha256()
    h.update(str(a.dtype).encode())
    h.update(str(a.shape).encode())
    h.update(a.tobytes())
    return h.hexdigest()[:16]


def as_counts(value: object, *, name: str, what: str) -> np.ndarray:
    """``value`` as a 1-D int64 array of numbers >= 0 (``what``: what one is, for the error);
    ``ValueError``/``TypeError`` naming ``name`` and the first bad entry."""
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D ({what}), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be integers, got dtype {arr.dtype}")
    if arr.size and arr.min() < 0:
        j = int(np.argmin(arr))
        raise ValueError(f"{name}[{j}] = {int(arr[j])}: {what} must be >= 0")
    return arr.astype(np.int64)


def as_labels(labels: object, *, name: str = "labels") -> np.ndarray:
    """One label per sample as a 1-D int64 or str array.

    Float labels (``RecordFile.labels()`` returns float32) are accepted when every value is a
    whole number; NaN and fractional values are refused naming the first bad position.
    """
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(
            f"{name} must be 1-D (one label per sample), got shape {arr.shape}; "
            f"for multi-label records pick one column, e.g. {name}[:, 0]"
        )
    if arr.dtype.kind in "iub":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{name}[{i}] = {arr[i].item()!r} is not a whole number")
        return arr.astype(np.int64)
    if arr.dtype.kind == "U":
        return arr
    if arr.dtype.kind == "O" and all(isinstance(x, str) for x in arr.tolist()):
        return arr.astype(str)
    raise TypeError(f"{name} must be integers or strings, got dtype {arr.dtype}")
