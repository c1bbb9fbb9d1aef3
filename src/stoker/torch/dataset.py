"""``RecordDataset``: a map-style ``torch.utils.data.Dataset`` over a data set in any format
stoker reads (``stoker.formats.open``: RecordIO, TFRecord, WebDataset, LMDB, ...).

For users who keep their ``torch.utils.data.DataLoader``: the dataset pickles as its path and
settings, and each worker process opens the files again on first use (an open file is never
shared between processes).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from stoker._core.errors import SpecError
from stoker._core.schema import Schema
from stoker._core.seeding import sample_rng
from stoker.torch._sample_fields import geometry_kinds, sample_fields

__all__ = ["RecordDataset"]


class RecordDataset(Dataset):
    """Sample ``i`` of a data set in any format (a ``.rec``, a ``.stoker.json`` manifest, a
    TFRecord file, a WebDataset shard, an LMDB folder, ...: whatever ``stoker.formats.open``
    opens; ``format=`` names it, ``options`` go to the format's reader).

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

    A set packed with fields (``docs/contracts.md``) gives a dict instead: the image tensor
    under the schema's image name, the label (as above) under its label name, and each
    carried field: numeric as a tensor of its shape, ragged as an ``(n, *shape)`` tensor,
    a mask as ``(H, W)``, text as ``str``, bytes as ``bytes``, ``size`` as int32 ``(2,)``.
    Boxes, points and masks move with the image through the transforms' ``apply_targets``,
    as in the loader. ``fields`` picks them like ``Loader(fields=)``: ``None`` every field of
    the set, a list the named ones (``"size"`` included), ``[]`` none (then ``(image,
    label)`` as for a set without fields). ``collate_fn()`` batches such dicts for a
    ``DataLoader`` (see :func:`stoker.torch.collate_fields`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        transforms: Any = None,
        seed: int = 0,
        epoch: int = 0,
        scale_on_decode: bool = True,
        fields: list[str] | tuple[str, ...] | None = None,
        format: str | None = None,
        **options: Any,
    ) -> None:
        if transforms is not None and not callable(transforms):
            raise TypeError(f"transforms must be callable (img, rng) -> img, got {transforms!r}")
        if fields is not None and (
            isinstance(fields, str) or not all(isinstance(n, str) for n in fields)
        ):
            raise TypeError(f"fields must be a list of field names or None, got {fields!r}")
        self.path = os.fspath(path)
        self.transforms = transforms
        self.seed = int(seed)
        self.epoch = int(epoch)
        self.scale_on_decode = bool(scale_on_decode)
        self.format = format
        self.options = dict(options)
        reader = self._open()
        self._n = len(reader)
        self.class_names = reader.class_names
        full = reader.schema
        self.schema: Schema = full.select(list(full.extra) if fields is None else list(fields))
        self._stored = tuple(self.schema.stored)
        kinds = geometry_kinds(self.schema)
        if kinds and transforms is not None:
            check = getattr(transforms, "check_targets", None)
            if check is None:
                raise SpecError(
                    f"the samples carry {sorted(kinds)}: transforms must be stoker transforms "
                    "that move them (apply_targets)"
                )
            check(kinds)
        self._reader: Any = reader
        self._pid = os.getpid()

    def _open(self) -> Any:
        from stoker.formats import open_reader

        return open_reader(self.path, format=self.format, **self.options)

    def _get_reader(self) -> Any:
        if self._reader is None:
            self._reader = self._open()
        elif self._pid != os.getpid():
            # a forked copy holds the parent's open files: never used, it is replaced by a
            # reader made from its configuration (what a reader pickles as), which reopens here
            self._reader = copy.copy(self._reader)
        self._pid = os.getpid()
        return self._reader

    def __len__(self) -> int:
        return self._n

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    @property
    def has_fields(self) -> bool:
        """True when samples are dicts (the set carries fields and ``fields`` kept some)."""
        return bool(self.schema.extra)

    def collate_fn(self, *, ragged: str = "list") -> Callable[[list[dict[str, Any]]], Any]:
        """A ``DataLoader`` ``collate_fn`` for this dataset's dict samples (picklable):
        :func:`stoker.torch.collate_fields` with this schema."""
        from stoker.torch.fields import collate_fields

        return collate_fields(self.schema, ragged=ragged)

    def __getitem__(self, i: int) -> Any:
        from stoker.codecs import decode, image_size, sniff

        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"RecordDataset index must be an int, got {type(i).__name__}")
        n = self._n
        idx = int(i) + n if i < 0 else int(i)
        if not 0 <= idx < n:
            raise IndexError(f"index {i} out of range for {n} records in {self.path}")
        read = self._get_reader().reader(np.array([idx], np.int64), self._stored)
        payload, label, _key, vals = read(idx)
        min_size = None  # as the loader does: a reduced JPEG scale when a downscale follows
        hint = getattr(self.transforms, "decode_hint", None)
        if hint is not None and self.scale_on_decode and sniff(payload) == "jpeg":
            min_size = hint(image_size(payload))
        img = decode(payload, min_size=min_size)
        rng = sample_rng(self.seed, self.epoch, idx)
        if not self.has_fields:
            if self.transforms is not None:
                img = self.transforms(img, rng)
            return torch.from_numpy(np.ascontiguousarray(img)), _label(label)
        stored = image_size(payload)
        where = f"{self.path}: position {idx}"
        img, out = sample_fields(self.schema, img, stored, vals, self.transforms, rng, where)
        sample: dict[str, Any] = {
            self.schema.image_name: torch.from_numpy(np.ascontiguousarray(img))
        }
        label_name = self.schema.header_name
        if label_name is not None:
            sample[label_name] = _label(label)
        sample.update(out)
        return sample

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
        state["_pid"] = None  # the reader travels as its configuration and reopens there
        return state


def _label(label: Any) -> Any:
    arr = np.asarray(label)
    if arr.ndim == 0:
        value = float(arr)
        return int(value) if value.is_integer() else value
    return torch.from_numpy(np.array(arr, dtype=np.float32))
