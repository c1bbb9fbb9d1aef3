"""stoker.torch: the PyTorch edge.

- :func:`as_tensors`: a loader's batches as tensors without a copy;
- :class:`CudaPrefetcher`: batches copied ahead on a side CUDA stream and converted on the GPU
  (uint8 over the bus; float, normalisation and layout on the device; CPU fallback);
- :class:`RecordDataset`: a map-style dataset over ``.rec`` shards for a plain DataLoader;
- :func:`distributed_info`: ``(rank, world_size)`` from ``torch.distributed``;
- :func:`field_tensors` and :func:`detection_targets`: a batch's fields as a dict of tensors
  (ragged fields as lists or padded with lengths) and as torchvision-style detection targets;
  :func:`collate_fields`: the ``DataLoader`` collate for :class:`RecordDataset` samples with
  fields.

:mod:`stoker.torch.backend` is the prefetcher's device seam (streams, events, pinned memory);
the doubles that check its protocol without and with a GPU are test code
(``tests/torch/torch_doubles.py``).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401 - only to name what is missing before the rest imports it
except ModuleNotFoundError as exc:
    if exc.name != "torch":
        raise
    raise ModuleNotFoundError(
        "stoker.torch needs PyTorch: pip install 'stoker[torch]' (or first install the torch "
        "build that matches your CUDA, https://pytorch.org/get-started/locally/); the rest of "
        "stoker (pack, Loader, doctor) works without it",
        name="torch",
    ) from exc

from stoker.torch._batch import TensorBatch  # noqa: E402 - after the torch check
from stoker.torch.augment import random_erase, random_flip
from stoker.torch.dataset import RecordDataset
from stoker.torch.distributed import distributed_info
from stoker.torch.fields import collate_fields, detection_targets, field_tensors
from stoker.torch.prefetcher import CudaPrefetcher, convert_images
from stoker.torch.tensors import as_tensors

__all__ = [
    "CudaPrefetcher",
    "RecordDataset",
    "TensorBatch",
    "as_tensors",
    "collate_fields",
    "convert_images",
    "detection_targets",
    "distributed_info",
    "field_tensors",
    "random_erase",
    "random_flip",
]
