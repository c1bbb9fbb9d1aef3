"""Per-class loss weights for imbalanced data (``CrossEntropyLoss(weight=...)``).

- ``scheme="inverse"``: ``w_c = N / (C * n_c)`` — the "balanced" weights of scikit-learn.
  Seed 001's ``len(labels) / count`` is ``N / n_c``, the same up to the constant ``C``
  (``normalize=False`` returns exactly that).
- ``scheme="effective_number"`` (Cui et al., CVPR 2019): ``w_c ∝ (1 - beta) / (1 - beta**n_c)``;
  ``beta -> 0`` gives equal weights, ``beta -> 1`` approaches inverse frequency.

``normalize=True`` (default) scales the weights so that the mean weight *per sample* is 1
(``sum_c n_c * w_c == N``), so the weighted loss keeps the scale of the unweighted one and the
learning rate needs no change. (Cui et al. normalise to ``sum_c w_c == C`` instead; multiply
by ``C / w.sum()`` for that.) Classes below ``num_classes`` without a sample get weight 0 and
a warning.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

__all__ = ["class_weights"]


def class_weights(
    labels: object,
    *,
    scheme: str = "inverse",
    beta: float = 0.999,
    num_classes: int | None = None,
    normalize: bool = True,
) -> np.ndarray:
    """One float64 weight per class ``0 .. C-1`` (``C = num_classes`` or ``max(label) + 1``).

    >>> class_weights([0, 0, 0, 1]).tolist()
    [0.6666666666666666, 2.0]
    >>> class_weights([0, 0, 0, 1], normalize=False).tolist()
    [1.3333333333333333, 4.0]
    """
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {arr.shape}")
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"labels[{i}] = {arr[i].item()!r} is not a whole number")
    elif arr.size and arr.dtype.kind not in "iub":
        raise TypeError(f"labels must be class numbers 0..C-1, got dtype {arr.dtype}")
    lab = arr.astype(np.int64)
    if lab.size == 0:
        raise ValueError("labels is empty")
    if lab.min() < 0:
        raise ValueError(f"labels must be >= 0, got {int(lab.min())}")
    if num_classes is None:
        num_classes = int(lab.max()) + 1
    elif isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    elif lab.max() >= num_classes:
        raise ValueError(f"label {int(lab.max())} is outside [0, num_classes={num_classes})")
    counts = np.bincount(lab, minlength=num_classes).astype(np.float64)
    present = counts > 0
    n = float(lab.size)
    w = np.zeros(num_classes, dtype=np.float64)
    if scheme == "inverse":
        w[present] = n / counts[present]
    elif scheme == "effective_number":
        if not (isinstance(beta, (int, float)) and 0.0 <= beta < 1.0 and math.isfinite(beta)):
            raise ValueError(f"beta must be in [0, 1), got {beta!r}")
        w[present] = (1.0 - beta) / (1.0 - np.power(beta, counts[present]))
    else:
        raise ValueError(f"scheme must be 'inverse' or 'effective_number', got {scheme!r}")
    if not present.all():
        missing = np.flatnonzero(~present).tolist()
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        warnings.warn(
            f"class_weights: {len(missing)} class(es) have no samples and get weight 0: {shown}",
            UserWarning,
            stacklevel=2,
        )
    if normalize:
        w *= n / float(np.sum(w * counts))
    return w
