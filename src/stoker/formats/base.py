"""The contracts every format implements: a sample-level :class:`Reader` (what the loader, the
DataLoader path, the doctor and the CLI use), a :class:`Shard` (one shard of a format's set,
which :class:`~stoker.formats.sharded.ShardedReader` makes a set of) and a :class:`ShardWriter`
(what pack and convert write through).

A :class:`Reader` is a data set in one format, with random access by position ``i`` in
``[0, len(r))``. It is the one read contract: every format's reader, an image folder and
in-memory arrays (``stoker.loader``) implement it, and the loader, ``RecordDataset``, the doctor
and the CLI read through it and nothing else. What a reader must give:

- ``len(r)``; ``r.keys()``: int64 record keys in position order;
- ``r.labels()``: every sample's label (the schema's header field) in bulk, without decoding an
  image: int64 ``(N,)`` class ids when every label is a whole number, else float32 ``(N,)`` or
  ``(N, k)``; what samplers need before the first batch;
- ``r.reader(indices=None, fields=()) -> f`` (or ``r.read(i)``, from which the default
  ``reader`` is made): made once per chunk of a batch with the chunk's positions (so a format
  can look them up at once); ``f(i) -> (image, label, key, fields)``: the image as stored (see
  ``encoded``: bytes or a memoryview valid until the next call, or a decoded array), the label
  as ``labels()`` holds it, the key, and a dict of the stored fields named in ``fields``
  (values as ``Field.check`` gives them; an empty dict when none are asked for); every failure
  names the file, the record and the byte offset;
- ``r.fingerprint()``: a JSON-safe identity (format, count, a hash of keys and labels) kept in
  loader state and checked on resume.

Everything else has a default, documented on its method (and listed in ``docs/contracts.md``),
to override where the reader knows better.

A reader pickles as its configuration (paths and options) and reopens lazily in the process
that uses it: no open handle, environment or large array crosses a process boundary. Index and
key caches live in the cache directory (:mod:`stoker._core.cache`), never required beside the
data, so read-only and shared sets work.

A :class:`ShardWriter` writes one shard: ``write(key, image, label, fields)`` appends one
sample (the encoded image bytes kept as they are), ``write_many(keys, images, labels, fields)``
appends many in order (in one go where the format's ``write_batch`` can, else one ``write``
each) and returns the ``(index, reason)`` of each it could not store, ``commit() -> dict`` makes the shard's files
final (written as ``*.partial`` and renamed) and returns its manifest entry, ``abort()``
removes what was written (a shard that is not whole is written again from scratch).
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import mmap
import os
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker._core.specs import ArraySpec
from stoker.codecs import DECODED_SPEC, encode_png, image_size

if TYPE_CHECKING:
    from stoker._core.schema import Schema

__all__ = [
    "ReadRecord",
    "ReadSample",
    "Reader",
    "Shard",
    "ShardWriter",
    "data_files",
    "is_encoded",
    "no_fields",
    "sha",
    "stored_size",
    "unmap",
]

#: ``f(i)`` of :meth:`Reader.reader`: ``(image, label, key, fields)``.
ReadSample = Callable[[int], tuple[Any, Any, int, dict[str, Any]]]


def data_files(path: str) -> list[str]:
    """The data files of a set opened from ``path`` (see :meth:`Reader.files`): the regular
    files of a folder, or ``path`` itself when it is a file (a manifest's reader, a
    ``ShardedReader``, names its shards' files itself)."""
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        return [p for p in (os.path.join(path, n) for n in names) if os.path.isfile(p)]
    return [path] if os.path.isfile(path) else []


def unmap(view: memoryview | None, mm: mmap.mmap | None) -> None:
    """Release ``view`` and close ``mm``, the map under it; while a caller still holds a slice
    of either, the map stays until the GC unmaps it."""
    with contextlib.suppress(BufferError):
        if view is not None:
            view.release()
        if mm is not None:
            mm.close()


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


def sha(*parts: bytes) -> str:
    """The loader's dataset hash in a fingerprint: sha256 of the length-prefixed ``parts``, 32
    hex digits (kept as it is, so saved loader states still resume)."""
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()[:32]


def is_encoded(encoded: bool | None, image: Any) -> bool:
    """Whether ``image`` from a reader whose :attr:`Reader.encoded` is ``encoded`` is encoded
    bytes to decode (``None``: per sample, an ndarray is decoded already)."""
    return encoded if encoded is not None else not isinstance(image, np.ndarray)


def stored_size(image: Any, encoded: bool | None = True) -> tuple[int, int]:
    """(height, width) of an image as a reader hands it over: a decoded array's shape, or the
    size an encoded image's header declares (the size decoding gives)."""
    if is_encoded(encoded, image):
        return image_size(image)
    shape = np.shape(image)
    return int(shape[0]), int(shape[1])


class Reader(_Closing, abc.ABC):
    """A data set; see the module docstring. A subclass implements ``__len__``, ``keys``,
    ``labels``, ``fingerprint`` and one of ``reader`` or ``read``."""

    #: The registry name of the format (``"recordio"``, ``"tfrecord"``, ...); empty for a
    #: reader that is no registered format (an image folder, arrays).
    format: str = ""
    #: What the reader was opened from (a file, a folder or a manifest).
    path: str = ""
    #: True: images are encoded bytes; False: decoded arrays of ``sample_spec``; None: per
    #: sample (an ndarray is decoded).
    encoded: bool | None = True

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def keys(self) -> np.ndarray: ...

    def key(self, i: int) -> int:
        return int(self.keys()[i])

    @abc.abstractmethod
    def labels(self) -> np.ndarray: ...

    def label_kind(self) -> tuple[tuple[int, ...], str]:
        """``(shape, dtype)`` of one label; from :meth:`labels` by default."""
        lab = self.labels()
        return tuple(lab.shape[1:]), lab.dtype.name

    @property
    def label_spec(self) -> ArraySpec:
        shape, dtype = self.label_kind()
        return ArraySpec(tuple(shape), dtype)

    @property
    def sample_spec(self) -> ArraySpec:
        """One image as read, before transforms (decoded: any size, 3 channels, uint8)."""
        return DECODED_SPEC

    @property
    def schema(self) -> Schema:
        """The fields of one sample; a set without declared fields has an image and a label."""
        from stoker._core.schema import Schema

        lab = self.label_spec
        return Schema.classification(tuple(int(d or 1) for d in lab.shape), lab.dtype)

    @property
    def class_names(self) -> list[str] | None:
        return None

    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()) -> ReadSample:
        """``f(i) -> (image, label, key, fields)`` (see the module docstring); by default made
        of :meth:`read` and :meth:`key`, for a reader that stores no fields."""
        if type(self).read is Reader.read:
            raise TypeError(
                f"{type(self).__name__} must implement reader(indices, fields) or read(i)"
            )
        no_fields(self, fields)
        read, key = self.read, self.key

        def get(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            k = key(i)
            image, label = read(i)
            return image, label, k, {}

        return get

    def read(self, i: int) -> tuple[Any, Any]:
        """``(image, label)`` of position ``i`` (one lookup; :meth:`reader` for many)."""
        if type(self).reader is Reader.reader:
            raise TypeError(
                f"{type(self).__name__} must implement reader(indices, fields) or read(i)"
            )
        image, label, _key, _fields = self.reader(np.array([i], np.int64))(i)
        return image, label

    def image_sizes(self) -> np.ndarray:
        """int32 ``(N, 2)``: the stored (height, width) of every sample, from the image headers
        (a decoded array: its shape), read in one pass and kept on the reader."""
        cached = self.__dict__.get("_image_sizes")
        if cached is not None:
            return cached
        from stoker._core.progress import make_progress

        n, encoded = len(self), self.encoded
        out = np.empty((n, 2), dtype=np.int32)
        get = self.reader(None, ())
        bar = make_progress(n, "reading image sizes") if encoded is not False else None
        try:
            for i in range(n):
                out[i] = self.size_of(i, get(i)[0])
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
            if (remote := self.remote()) is not None:
                remote.let_go()
        self.__dict__["_image_sizes"] = out
        return out

    def size_of(self, i: int, image: Any) -> tuple[int, int]:
        """:func:`stored_size` of sample ``i``'s ``image``; an ``ImageDecodeError`` names it."""
        from stoker._core.errors import ImageDecodeError

        try:
            return stored_size(image, self.encoded)
        except ImageDecodeError as e:
            raise ImageDecodeError(f"{self.describe(i)}: {e}") from e

    def stored_bytes(self, image: Any) -> Any:
        """``image`` as this reader handed it over, as encoded bytes (what ``stoker convert``
        writes and ``stoker unpack`` saves): encoded bytes as they are, a decoded array as a
        lossless PNG."""
        if is_encoded(self.encoded, image):
            return image
        return encode_png(np.ascontiguousarray(image))

    def describe(self, i: int) -> str:
        return f"key {self.key(i)} (position {i}) of {self.path}"

    def locate(self, i: int) -> tuple[str, int] | None:
        """``(file, byte offset)`` of sample ``i``, or ``None`` when the format cannot tell."""
        return None

    def files(self) -> list[str]:
        """The data files behind the reader: :func:`data_files` of ``path`` by default."""
        return data_files(self.path)

    def summary(self) -> dict:
        """Format-specific facts for ``stoker inspect`` (JSON-safe); none by default."""
        return {}

    def identity_table(self) -> dict | None:
        """An insightface set's header and identity records as JSON (what ``stoker unpack``
        keeps beside the images); ``None`` for any other set (the default)."""
        return None

    def shard_sizes(self) -> np.ndarray | None:
        """int64 records per shard in position order, or ``None`` when the set has no
        shards (the default)."""
        return None

    def block_sizes(self) -> np.ndarray | None:
        """int64 records per block in position order where the set's shards read in blocks
        (each shard cut into whole blocks), else ``None`` (the default): what shard-aware order
        windows."""
        return None

    def share(self) -> None:  # noqa: B027 - optional hook
        """Make the reader ready to cross to worker processes; the loader calls it before it
        starts workers. Nothing to do for a reader that pickles as its configuration."""

    def remote(self) -> Any:
        """A set read through the node's shard cache: what the loader asks of it
        (:class:`~stoker.formats.shardfiles.RemoteSet`: ``claim``, ``read_ahead``,
        ``probe_positions``, ``let_go``, ``shards``); ``None`` (the default) for a local set."""
        return None

    @abc.abstractmethod
    def fingerprint(self) -> dict: ...

    def close(self) -> None:  # noqa: B027 - optional
        pass


#: ``f(r, key)`` of :meth:`Shard.reader`: ``(image, label, fields)`` of record ``r``.
ReadRecord = Callable[[int, int], tuple[Any, Any, dict[str, Any]]]


class Shard(_Closing, abc.ABC):
    """One shard of a set, opened from its files (a format's ``FORMAT.open_shard``): what a
    format writes to be read; :class:`~stoker.formats.sharded.ShardedReader` makes the set
    (manifest, positions, the open-shard LRU, object storage). Records are ``r`` in
    ``[0, len(s))``. ``path``: where the shard is, for messages; ``blocks``: the first record
    of each run of records the format reads together (a compressed chunk, a row group), or
    ``None`` when any record reads alone (shard-aware order keeps a window inside few)."""

    path: str = ""
    blocks: np.ndarray | None = None

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def keys(self) -> np.ndarray | None:
        """int64 stored keys in record order, or ``None`` (the set's positions are its keys)."""

    @abc.abstractmethod
    def labels(self) -> np.ndarray | None:
        """Every record's label (as :meth:`Reader.labels`), or ``None`` when none is stored."""

    @property
    @abc.abstractmethod
    def schema(self) -> Schema: ...

    @abc.abstractmethod
    def reader(self, rows: np.ndarray | None, fields: tuple[str, ...]) -> ReadRecord:
        """``f(r, key) -> (image, label, fields)`` for a chunk reading ``rows`` (``None``: any);
        ``fields`` are stored fields the schema has; an error names the file, the record, its
        key and byte offset. The shard maps its files again if it was closed meanwhile."""

    @abc.abstractmethod
    def where(self, r: int) -> tuple[int, str]:
        """Record ``r``'s byte offset in the data file and its name for messages."""

    def close(self) -> None:  # noqa: B027 - a shard without open files
        """Let go of open files and maps (what is indexed stays); a read opens them again."""


def no_fields(reader: Reader, fields: tuple[str, ...]) -> None:
    """:class:`SpecError` when ``fields`` are asked of a reader that stores none beyond the
    image and the label."""
    if fields:
        from stoker._core.errors import SpecError

        where = f" ({reader.path})" if reader.path else ""
        raise SpecError(
            f"{type(reader).__name__}{where} stores no fields beyond the image and the label; "
            f"asked for {list(fields)}"
        )


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

    def write_many(
        self,
        keys: Sequence[int],
        images: Sequence[bytes],
        labels: Sequence[Any],
        fields: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> list[tuple[int, str]]:
        """Append sample ``j`` for each ``j`` in order (``fields``: one mapping a sample, or
        ``None``); the ``(j, reason)`` of each sample that cannot be stored (the ``ValueError``
        :meth:`write` raises for it), the others written as :meth:`write` writes them: in one
        go where :meth:`write_batch` can, else one :meth:`write` each."""
        plain = fields is None or not any(fields)  # no sample has a field for write to check
        if len(keys) and plain and self.write_batch(keys, images, labels):
            return []
        errors = []
        for j, key in enumerate(keys):
            try:
                self.write(key, images[j], labels[j], None if fields is None else fields[j])
            except ValueError as e:
                errors.append((j, str(e)))
        return errors

    def write_batch(
        self, keys: Sequence[int], images: Sequence[bytes], labels: Sequence[Any]
    ) -> bool:
        """Write these samples (their fields, if any, left to :meth:`write`) in one go, to the
        bytes :meth:`write` gives each; ``False``, with nothing written, when this format
        cannot (the default: it never does)."""
        return False

    @staticmethod
    def _new_keys(keys: Sequence[int], seen: set[int]) -> bool:
        """Whether ``keys`` are plain ints in ``[0, 2**63)``, distinct and none in ``seen``:
        what a format's :meth:`write_batch` asks before writing them in one go."""
        if not all(type(k) is int for k in keys):
            return False
        fresh = len(set(keys)) == len(keys) and seen.isdisjoint(keys)
        return fresh and min(keys) >= 0 and max(keys) < 1 << 63

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
