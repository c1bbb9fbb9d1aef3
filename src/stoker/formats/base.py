"""The contracts every format implements: a sample-level :class:`Reader` (what the loader, the
DataLoader path, the doctor and the CLI use), a :class:`ShardWriter` (what pack and convert
write through), and the record-level :class:`RecordReader` RecordIO's files keep.

A :class:`Reader` is a data set in one format, with random access by position ``i`` in
``[0, len(r))``:

- ``len(r)``; ``r.keys()``: int64 record keys in position order; ``r.key(i)``;
- ``r.schema``: the :class:`~stoker._core.schema.Schema` of one sample (a set without declared
  fields is ``Schema.classification(...)``: an image and its label);
- ``r.labels()``: every sample's label (the schema's header field) in bulk, without decoding an
  image: int64 ``(N,)`` class ids when every label is a whole number, else float32 ``(N,)`` or
  ``(N, k)``; what samplers need before the first batch;
- ``r.class_names``: class names in id order, or ``None``;
- ``r.reader(indices=None, fields=()) -> f``: made once per chunk of a batch with the chunk's
  positions (so a format can look them up at once); ``f(i) -> (image, label, key, fields)``:
  the encoded image bytes as stored (bytes or a memoryview valid until the next call), the
  label as ``labels()`` holds it, the key, and a dict of the stored fields named in
  ``fields`` (values as ``Field.check`` gives them; an empty dict when none are asked for);
  every failure names the file, the record and the byte offset;
- ``r.describe(i)``: where sample ``i`` lives, for messages (file, key, byte offset);
- ``r.locate(i)``: ``(file, byte offset)`` of sample ``i`` where the format can tell, else
  ``None``; ``r.files()``: the data files the samples are read from (what the doctor sizes and
  evicts from the page cache); ``r.summary()``: format-specific facts ``stoker inspect``
  shows (JSON-safe: shards, bytes per record, a layout); all three optional, with defaults;
- ``r.shard_sizes()``: int64 records per shard in position order (positions run through the
  shards in order), or ``None`` for a set that is not made of shards (the default); what
  shard-aware order (``shuffle="shards"``) deals to the ranks;
- ``r.fingerprint()``: a JSON-safe identity (format, count, a hash of keys and labels) kept in
  loader state and checked on resume;
- ``r.close()``.

A reader pickles as its configuration (paths and options) and reopens lazily in the process
that uses it: no open handle, environment or large array crosses a process boundary. Index and
key caches live in the cache directory (:mod:`stoker._core.cache`), never required beside the
data, so read-only and shared sets work.

A :class:`ShardWriter` writes one shard: ``write(key, image, label, fields)`` appends one
sample (the encoded image bytes kept as they are), ``commit() -> dict`` makes the shard's files
final (written as ``*.partial`` and renamed) and returns its manifest entry, ``abort()``
removes what was written (a shard that is not whole is written again from scratch).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker.formats.manifest import MANIFEST_SUFFIX, read_json

if TYPE_CHECKING:
    from stoker._core.schema import Schema

__all__ = ["ReadSample", "Reader", "RecordReader", "ShardWriter", "data_files"]

#: ``f(i)`` of :meth:`Reader.reader`: ``(image bytes, label, key, fields)``.
ReadSample = Callable[[int], tuple[Any, Any, int, dict[str, Any]]]


def data_files(path: str) -> list[str]:
    """The data files of a set opened from ``path`` (see :meth:`Reader.files`); names a
    manifest gives are kept only when relative, inside its folder and existing."""
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        return [p for p in (os.path.join(path, n) for n in names) if os.path.isfile(p)]
    if not path.endswith(MANIFEST_SUFFIX):
        return [path] if os.path.isfile(path) else []
    folder = os.path.dirname(os.path.abspath(path))
    out: list[str] = []
    try:
        shards = read_json(path).get("shards", [])
    except Exception:  # noqa: BLE001 - best effort: the reader itself reports a bad manifest
        return out
    for entry in shards if isinstance(shards, list) else ():
        # a shard's files by role (version 2), or the string fields of a version-1 entry
        files = entry.get("files", entry) if isinstance(entry, dict) else {}
        for v in files.values() if isinstance(files, dict) else ():
            if not isinstance(v, str) or not v or os.path.isabs(v) or ".." in v.split("/"):
                continue
            p = os.path.join(folder, v)
            if os.path.isfile(p) and p not in out:
                out.append(p)
    return out


class _Closing:
    def close(self) -> None:  # pragma: no cover - overridden
        pass

    def __enter__(self):
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Reader(_Closing, abc.ABC):
    """A data set in one format; see the module docstring."""

    #: The registry name of the format (``"recordio"``, ``"tfrecord"``, ...).
    format: str = ""
    #: What the reader was opened from (a file, a folder or a manifest).
    path: str = ""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def keys(self) -> np.ndarray: ...

    def key(self, i: int) -> int:
        return int(self.keys()[i])

    @property
    @abc.abstractmethod
    def schema(self) -> Schema: ...

    @abc.abstractmethod
    def labels(self) -> np.ndarray: ...

    @property
    def class_names(self) -> list[str] | None:
        return None

    @abc.abstractmethod
    def reader(
        self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()
    ) -> ReadSample: ...

    def describe(self, i: int) -> str:
        return f"key {self.key(i)} (position {i}) of {self.path}"

    def locate(self, i: int) -> tuple[str, int] | None:
        """``(file, byte offset)`` of sample ``i``, or ``None`` when the format cannot tell."""
        return None

    def files(self) -> list[str]:
        """The data files behind the reader: ``path`` when it is a file other than a manifest,
        the regular files of a folder, or the files a manifest's shard entries name."""
        return data_files(self.path)

    def summary(self) -> dict:
        """Format-specific facts for ``stoker inspect`` (JSON-safe); none by default."""
        return {}

    def shard_sizes(self) -> np.ndarray | None:
        """int64 records per shard in position order, or ``None`` when the set has no
        shards (the default)."""
        return None

    @abc.abstractmethod
    def fingerprint(self) -> dict: ...

    def close(self) -> None:  # noqa: B027 - optional
        pass


class ShardWriter(_Closing, abc.ABC):
    """Writes one shard of one format; see the module docstring."""

    @abc.abstractmethod
    def write(
        self,
        key: int,
        image: bytes | memoryview,
        label: Any,
        fields: Mapping[str, Any] | None = None,
    ) -> None: ...

    @property
    @abc.abstractmethod
    def keys_written(self) -> np.ndarray: ...

    @property
    @abc.abstractmethod
    def bytes_written(self) -> int: ...

    @abc.abstractmethod
    def commit(self) -> dict: ...

    @abc.abstractmethod
    def abort(self) -> None: ...

    def close(self) -> None:
        self.abort()


class RecordReader(_Closing, abc.ABC):
    """A file of records with random access by position (RecordIO's ``.rec`` through its
    ``.idx``): ``len``, ``key(i)``, ``read(i)`` (the record's payload as a memoryview, valid
    until ``close``), ``close()``."""

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def key(self, i: int) -> int: ...

    @abc.abstractmethod
    def read(self, i: int) -> memoryview: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def _check_index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record position {i} out of range for {n} records")
        return i + n if i < 0 else i
