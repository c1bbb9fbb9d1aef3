"""``RecordDataset``: a map-style ``torch.utils.data.Dataset`` over stoker's RecordIO shards.

For users who keep their ``torch.utils.data.DataLoader``: the dataset pickles as its path and
settings, and each worker process opens the files again on first use (an open file is never
shared between processes).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from stoker._core.seeding import sample_rng

__all__ = ["RecordDataset"]


class RecordDataset(Dataset):
    """Sample ``i`` of a ``.rec`` (or its ``.idx``, or a ``.stoker.json`` manifest).

    ``ds[i]`` is ``(image, label)``: the decoded image as a uint8 HWC RGB tensor after
    ``transforms`` (a stoker ``Transform`` called with ``sample_rng(seed, epoch, i)``, so the
    augmentation of a sample depends only on (seed, epoch, i)), and the label as an ``int``
    (a whole-number scalar label), a ``float``, or a float32 tensor (a label vector). Decoding
    and augmentation are those of ``stoker.Loader`` (with ``scale_on_decode``, a JPEG is
    decoded at a reduced scale when the transforms' ``decode_hint`` allows it), so sample
    ``i`` equals the loader's sample ``i`` for the same seed and epoch.

    Call ``set_epoch(e)`` before each epoch for fresh augmentation; with
    ``persistent_workers=True`` the workers keep the epoch they started with, so leave that
    off or pass ``epoch`` through your own sampler.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        transforms: Any = None,
        seed: int = 0,
        epoch: int = 0,
        scale_on_decode: bool = True,
    ) -> None:
        if transforms is not None and not callable(transforms):
            raise TypeError(f"transforms must be callable (img, rng) -> img, got {transforms!r}")
        self.path = os.fspath(path)
        self.transforms = transforms
        self.seed = int(seed)
        self.epoch = int(epoch)
        self.scale_on_decode = bool(scale_on_decode)
        reader = self._open()
        self._n = len(reader)
        self.class_names = reader.class_names
        self._reader: Any = reader
        self._pid = os.getpid()

    def _open(self) -> Any:
        from stoker.formats.recordio import open_records

        return open_records(self.path)

    def _get_reader(self) -> Any:
        if self._reader is None or self._pid != os.getpid():
            self._reader = self._open()  # a forked copy is dropped, never used
            self._pid = os.getpid()
        return self._reader

    def __len__(self) -> int:
        return self._n

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, Any]:
        from stoker.codecs import decode, image_size, sniff

        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"RecordDataset index must be an int, got {type(i).__name__}")
        n = self._n
        idx = int(i) + n if i < 0 else int(i)
        if not 0 <= idx < n:
            raise IndexError(f"index {i} out of range for {n} records in {self.path}")
        header, payload = self._get_reader().read_header(idx)
        min_size = None  # as the loader does: a reduced JPEG scale when a downscale follows
        hint = getattr(self.transforms, "decode_hint", None)
        if hint is not None and self.scale_on_decode and sniff(payload) == "jpeg":
            min_size = hint(image_size(payload))
        img = decode(payload, min_size=min_size)
        if self.transforms is not None:
            img = self.transforms(img, sample_rng(self.seed, self.epoch, idx))
        return torch.from_numpy(np.ascontiguousarray(img)), _label(header.label)

    def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()

    def __enter__(self) -> RecordDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reader"] = None  # reopened by path in the receiving process
        return state


def _label(label: Any) -> Any:
    arr = np.asarray(label)
    if arr.ndim == 0:
        value = float(arr)
        return int(value) if value.is_integer() else value
    return torch.from_numpy(np.array(arr, dtype=np.float32))
