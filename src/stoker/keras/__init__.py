"""stoker.keras: hand a stoker loader to Keras 3 ``model.fit``.

Set ``KERAS_BACKEND`` (``torch``, ``tensorflow`` or ``jax``) before importing keras; the
torch and tensorflow backends are tested.
Keras sees a single-worker ``PyDataset`` and never forks; the loader's worker processes do
the decoding and augmentation into shared memory.
"""

from __future__ import annotations

from stoker.keras._dataset import KerasDataset, dataset
from stoker.keras._resume import LoaderCheckpoint, fit_resumable

__all__ = ["KerasDataset", "LoaderCheckpoint", "dataset", "fit_resumable"]
