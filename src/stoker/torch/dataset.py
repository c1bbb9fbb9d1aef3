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

from stoker._core.checks import check_int
from stoker._core.errors import IncompatibleStateError, SpecError
from stoker._core.schema import Schema
from stoker._core.seeding import sample_rng
from stoker.torch._sample_fields import geometry_kinds, sample_fields

__all__ = ["RecordDataset"]

#: ``layout=`` choices: one sample's axes
LAYOUTS = ("HWC", "CHW")


class RecordDataset(Dataset):
    """Sample ``i`` of a data set in any format (a ``.rec``, a ``.stoker.json`` manifest, a
    TFRecord file, a WebDataset shard, an LMDB folder, ...: whatever ``stoker.formats.open``
    opens; ``format=`` names it, ``options`` go to the format's reader).

    ``ds[i]`` is ``(image, label)``: the decoded image as a uint8 HWC RGB tensor after
    ``transforms``, and the label as an ``int`` (a whole-number scalar label), a ``float``, or
    a float32 tensor (a label vector). ``transforms`` is a stoker ``Transform`` or a plain
    callable ``f(img)`` or ``f(img, rng)`` on an HWC ndarray (wrapped with
    :func:`stoker.transforms.as_transform`); it is called with ``sample_rng(seed, epoch, i)``,
    so the augmentation of a sample depends only on (seed, epoch, i). Decoding and
    augmentation are those of ``stoker.Loader`` (with ``scale_on_decode``, a JPEG is decoded
    at a reduced scale when the transforms' ``decode_hint`` allows it), so sample ``i`` equals
    the loader's sample ``i`` for the same seed and epoch.

    ``layout="CHW"`` gives the image channels first, as torchvision models take it (a 2-D
    image becomes ``(1, H, W)``), in the dtype the transforms give: uint8 without them (4
    times fewer bytes through the DataLoader's workers; normalise on the device), float32
    after a ``Normalize`` (``Normalize(mean, std)`` with torchvision's 0-1 constants gives
    what ``ToTensor()`` + ``Normalize`` give). A chain that already ends channels first
    (``Normalize(layout="CHW")``) is refused with ``layout="CHW"``: it would be transposed
    twice.

    The samples are the image records: an insightface (MS1M) set's header and identity
    records are not samples. As torchvision's ``ImageFolder``: ``targets`` (the label of
    every sample, a list of ``int`` class ids), ``classes`` (class ``j``'s name at index
    ``j``: the set's class names, or, for a set without them such as an insightface set,
    the ids ``"0" .. str(max label)``) and ``class_to_idx``; ``len(ds.classes)`` is the
    number of outputs a classifier needs.

    Call ``set_epoch(e)`` before each epoch for fresh augmentation; with
    ``persistent_workers=True`` the workers keep the epoch they started with, so leave that
    off or pass ``epoch`` through your own sampler. ``state_dict()``/``load_state_dict()``
    carry the epoch and seed; with a stoker sampler (which keeps its own position) torchdata's
    ``StatefulDataLoader`` resumes mid-epoch with the same samples and augmentation
    (``docs/sampling.md``, *Resuming a DataLoader*). ``path`` a list of sets reads them laid
    end to end (``stoker.loader.MixtureSource``): pair it with ``MixtureOrder(ds.sizes,
    weights, ...)`` as the sampler, whose draw ids it takes (``docs/mixing.md``).

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
        layout: str = "HWC",
        format: str | None = None,
        **options: Any,
    ) -> None:
        transforms = _wrap(transforms)
        _check_layout(layout, transforms)
        if fields is not None and (
            isinstance(fields, str) or not all(isinstance(n, str) for n in fields)
        ):
            raise TypeError(f"fields must be a list of field names or None, got {fields!r}")
        self.path: Any = [os.fspath(p) for p in path] if isinstance(path, list) else os.fspath(path)
        self.transforms = transforms
        self.seed = int(seed)
        self.epoch = int(epoch)
        self.scale_on_decode = bool(scale_on_decode)
        self.layout = layout
        self.format = format
        self.options = dict(options)
        self._targets: list[Any] | None = None
        reader = self._open()
        self._n = len(reader)
        self.sizes = getattr(reader, "sizes", np.array([self._n])).tolist()  # per set
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

        if isinstance(self.path, list):  # a mixture: read by draw id, weighted by its sampler
            from stoker.loader.sources.mixture import MixtureSource

            sets = [open_reader(p, format=self.format, **self.options) for p in self.path]
            return MixtureSource(sets, [1] * len(sets), owned=[True] * len(sets))
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

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "seed"}``: what the augmentation depends on besides the index. torchdata's
        ``StatefulDataLoader`` saves it with the loader's state (in each worker's copy too)
        and restores it, so a resumed epoch is augmented as the interrupted one was."""
        return {"epoch": self.epoch, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the epoch of ``state``; a state of another seed raises
        ``IncompatibleStateError``, a malformed one ``ValueError``/``TypeError``."""
        if not isinstance(state, dict) or sorted(state) != ["epoch", "seed"]:
            raise ValueError(
                f"a RecordDataset state is {{'epoch': int, 'seed': int}}, got {state!r:.200}"
            )
        seed = check_int("seed", state["seed"], minimum=0)
        if seed != self.seed:
            raise IncompatibleStateError(
                f"seed: the state was saved with seed={seed}, this dataset has seed={self.seed}"
            )
        self.epoch = check_int("epoch", state["epoch"], minimum=0)

    @property
    def targets(self) -> list[Any]:
        """The label of every sample, in order (``ImageFolder.targets``): ``int`` class ids;
        a set with other labels gives them as they are (``float``, or a list per sample)."""
        if self._targets is None:
            self._targets = self._get_reader().labels().tolist()
        return self._targets

    @property
    def classes(self) -> list[str]:
        """Class ``j``'s name at index ``j`` (``ImageFolder.classes``): the set's class names,
        or ``"0" .. str(max label)`` for a set without them. A set whose labels are not
        class ids (fractional or several per sample) raises ``ValueError``."""
        return _class_table(self.class_names, self._get_reader().labels(), self.path)

    @property
    def class_to_idx(self) -> dict[str, int]:
        """``{name: id}`` for :attr:`classes` (``ImageFolder.class_to_idx``)."""
        return {name: j for j, name in enumerate(self.classes)}

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
        from stoker.formats.base import is_encoded

        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"RecordDataset index must be an int, got {type(i).__name__}")
        n = self._n
        idx = int(i) + n if i < 0 else int(i)
        if not 0 <= idx < (n if not isinstance(self.path, list) else 1 << 62):
            raise IndexError(f"index {i} out of range for {n} records in {self.path}")
        read = self._get_reader().reader(np.array([idx], np.int64), self._stored)
        payload, label, _key, vals = read(idx)
        encoded = is_encoded(self._get_reader().encoded, payload)
        min_size = None  # as the loader does: a reduced JPEG scale when a downscale follows
        hint = getattr(self.transforms, "decode_hint", None)
        if encoded and hint is not None and self.scale_on_decode and sniff(payload) == "jpeg":
            min_size = hint(image_size(payload))
        img = decode(payload, min_size=min_size) if encoded else payload
        rng = sample_rng(self.seed, self.epoch, idx)
        if not self.has_fields:
            if self.transforms is not None:
                img = self.transforms(img, rng)
            return self._tensor(img), _label(label)
        stored = image_size(payload) if encoded else img.shape[:2]
        where = f"{self.path}: position {idx}"
        img, out = sample_fields(self.schema, img, stored, vals, self.transforms, rng, where)
        sample: dict[str, Any] = {self.schema.image_name: self._tensor(img)}
        label_name = self.schema.header_name
        if label_name is not None:
            sample[label_name] = _label(label)
        sample.update(out)
        return sample

    def _tensor(self, img: np.ndarray) -> torch.Tensor:
        if self.layout == "CHW":
            img = img[None] if img.ndim == 2 else img.transpose(2, 0, 1)
        return torch.from_numpy(np.ascontiguousarray(img))

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
        state["_targets"] = None  # every label: made again where asked for, never sent
        return state


def _class_table(names: list[str] | None, labels: np.ndarray, path: str) -> list[str]:
    """Class ``j``'s name at index ``j``: ``names``, or the ids ``"0" .. str(max label)`` (so
    ``classes[target]`` works and ``len(classes)`` covers every label) when there are none."""
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        what = f"{labels.shape[1]} per sample" if labels.ndim == 2 else f"{labels.dtype} values"
        raise ValueError(
            f"{path}: the labels are not class ids ({what}); classes and class_to_idx need one "
            "whole-number label per sample (targets gives the labels as they are)"
        )
    if names:
        return list(names)
    top = int(labels.max()) if labels.size else -1
    return [str(j) for j in range(top + 1)]


def _wrap(transforms: Any) -> Any:
    """A stoker ``Transform`` as it is; a plain callable through ``as_transform``."""
    if transforms is None:
        return None
    if not callable(transforms):
        raise TypeError(
            "transforms must be a stoker Transform or a callable f(img) or f(img, rng) -> img, "
            f"got {type(transforms).__name__}"
        )
    from stoker.transforms import as_transform

    return as_transform(transforms)


def _check_layout(layout: Any, transforms: Any) -> None:
    """``layout`` is one of :data:`LAYOUTS`; ``"CHW"`` after a chain that ends channels first
    (its output spec ``(C, H, W)``) is refused: it would be transposed twice."""
    if layout not in LAYOUTS:
        hint = (
            f" (one sample has no batch axis: {layout[1:]!r})" if layout in ("NHWC", "NCHW") else ""
        )
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}{hint}")
    if layout != "CHW" or transforms is None:
        return
    from stoker.codecs import DECODED_SPEC

    try:
        shape = transforms.output_spec(DECODED_SPEC).shape
    except Exception:  # noqa: BLE001 - a chain that cannot tell its output is taken as HWC
        return
    if len(shape) == 3 and shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4):
        raise ValueError(
            f"layout='CHW': the transforms already give channels first {tuple(shape)} (a "
            "Normalize(layout='CHW')?), so the image would be transposed twice; keep "
            "layout='HWC' or let the transforms end in HWC"
        )


def _label(label: Any) -> Any:
    arr = np.asarray(label)
    if arr.ndim == 0:
        value = float(arr)
        return int(value) if value.is_integer() else value
    return torch.from_numpy(np.array(arr, dtype=np.float32))
