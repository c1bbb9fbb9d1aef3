"""What ``stoker convert`` packs: the samples of a data set in any format the registry reads,
taken by position and stored as they are.

A convert is shard jobs whose items are a :class:`~stoker.formats.base.Reader`'s positions:
the driver opens the source once for its length, keys, labels, classes and schema (the plan);
each shard job gets the reader (it pickles as its configuration and opens itself lazily in
the job's process) and reads its positions, writing the image bytes untouched and the stored
fields (``records.convert_range``). A record that fails to read is a reject naming its key,
the file and the byte offset (:func:`reject_text`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np

from stoker._core.errors import PackError
from stoker._core.files import Item, ScanResult
from stoker._core.schema import Schema
from stoker.formats.base import Reader
from stoker.formats.remote import local_path, remote_url
from stoker.pack.plan.options import PackOptions

__all__ = [
    "SourceItem",
    "SourceItems",
    "item_label",
    "manifest_schema",
    "open_source",
    "reject_text",
    "source_digest",
]


@dataclass(frozen=True)
class SourceItem(Item):
    """An :class:`Item` of a convert: sample ``pos`` of the source."""

    pos: int = 0


def item_label(row: Any) -> float | tuple[float, ...]:
    """A bulk label as an item holds it: an int or float, or a tuple for a label vector."""
    arr = np.asarray(row)
    if arr.ndim:
        return tuple(float(v) for v in arr.reshape(-1).tolist())
    v = arr.item()
    return int(v) if arr.dtype.kind in "iub" else float(v)


class SourceItems(Sequence[Item]):
    """The items of a source, made when asked for (a million positions need no million
    objects up front)."""

    def __init__(self, path: str, keys: np.ndarray, labels: np.ndarray) -> None:
        self.path = path
        self.name = os.path.basename(os.path.normpath(path))
        self.keys = keys
        self.labels = labels

    def __len__(self) -> int:
        return len(self.keys)

    def _one(self, i: int) -> SourceItem:
        rel = f"{self.name}#{i}"
        return SourceItem(self.path, rel, item_label(self.labels[i]), int(self.keys[i]), i)

    @overload
    def __getitem__(self, i: int) -> Item: ...

    @overload
    def __getitem__(self, i: slice) -> list[Item]: ...

    def __getitem__(self, i: int | slice) -> Item | list[Item]:
        if isinstance(i, slice):
            return [self._one(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._one(i % n)


def open_source(options: PackOptions) -> tuple[ScanResult, Reader]:
    """The source's items (keys, labels and classes from the reader, no sample read) and the
    reader itself."""
    from stoker.formats import open_reader

    src = os.fspath(options.src)
    if remote_url(src) is None and not os.path.exists(local_path(src)):
        raise PackError(f"{src}: no such file or folder")
    try:
        reader = open_reader(src, format=options.source_format, **(options.source_options or {}))
    except (ValueError, TypeError) as e:
        raise PackError(str(e)) from None
    keys = np.asarray(reader.keys(), dtype=np.int64)
    labels = np.asarray(reader.labels())
    if len(keys) != len(reader) or len(labels) != len(reader):
        raise PackError(
            f"{src}: the reader gives {len(keys)} keys and {len(labels)} labels "
            f"for {len(reader)} samples"
        )
    names = reader.class_names or []
    items: Any = SourceItems(src, keys, labels)  # a lazy sequence where a list is typed
    scan = ScanResult(items=items, classes={n: i for i, n in enumerate(names)})
    scan.found = len(reader)
    return scan, reader


def source_digest(reader: Reader, keys: np.ndarray, labels: np.ndarray) -> bytes:
    """What a convert's resume fingerprint holds of the source: its own fingerprint, and the
    keys and labels in plan order."""
    h = hashlib.sha256()
    h.update(json.dumps(reader.fingerprint(), sort_keys=True, default=str).encode())
    h.update(np.ascontiguousarray(keys, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(labels).tobytes())
    return h.digest()


def manifest_schema(schema: Schema | None, lengths: dict[str, int]) -> Schema:
    """The schema a packed or converted set's manifest declares: the writer's (an image and
    its int64 class id when there is none), with each variable field's ``max_len`` over the
    records written."""
    return (schema or Schema.classification()).with_max_len(lengths)


def reject_text(reader: Reader, i: int, e: BaseException) -> str:
    """The reject text of position ``i``: the error, with the file and byte offset of the
    record when the error does not say them."""
    msg = f"{type(e).__name__}: {e}"
    offset = getattr(e, "offset", None)
    if offset is None:
        try:
            where = reader.locate(i) if hasattr(reader, "locate") else None
        except Exception:  # noqa: BLE001 - a message, best effort
            where = None
        if where is not None:
            msg += f" (record at byte {where[1]} of {where[0]})"
    return f"position {i}: {msg}"
