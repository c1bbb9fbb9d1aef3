"""Where samples come from: packed records, an image folder, or arrays in shared memory.

A :class:`Source` gives random access by global position ``i``:

- ``len(s)``, ``s.key(i)`` (the integer record key errors name), ``s.keys()``, ``s.labels()``;
- ``s.read(i) -> (payload, label)`` in the worker: encoded bytes when ``s.encoded`` (the
  loader decodes them with :func:`stoker.codecs.decode`), else the image array itself;
- ``s.load(i) -> (image, label)``: ``read`` plus decoding;
- ``s.sample_spec`` (one image as read, before transforms) and ``s.label_spec`` (one label);
- ``s.fingerprint()``: a JSON-safe identity stored in loader state;
- ``s.describe(i)``: where sample ``i`` lives, for error messages;
- ``s.reader(indices) -> f``: made once per chunk of a batch with the chunk's global
  positions, ``f(i) -> (payload, label, key)`` per sample (the default calls ``read`` and
  ``key``); the loader always passes ``indices``, so an override must accept them;
- ``s.share()``: called by the loader before it starts workers (a no-op by default).

Sources pickle as their configuration (a path, a file list, a shared-memory segment name) and
reopen in the worker; no open handle or large array crosses a process boundary.
"""

from __future__ import annotations

import abc
import hashlib
import os
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.files import IMAGE_EXTENSIONS, scan_folder
from stoker._core.specs import ArraySpec
from stoker.codecs import DECODED_SPEC, decode
from stoker.loader._shm import Segment, create_segment, preflight

__all__ = [
    "ArraySource",
    "FolderSource",
    "RecordSource",
    "Source",
    "as_source",
]


def _sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()[:32]


def _integral_labels(labels: np.ndarray) -> np.ndarray:
    """float labels that are all whole numbers become int64 (class ids); others stay float32."""
    if labels.size and labels.dtype.kind == "f":
        if labels.ndim == 1 and np.all(np.isfinite(labels)) and np.all(labels == np.round(labels)):
            return labels.astype(np.int64)
        return labels.astype(np.float32)
    return labels


class Source(abc.ABC):
    """Random access to samples by global position; see the module docstring."""

    #: True when ``read`` returns encoded bytes to decode.
    encoded: bool = True

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def key(self, i: int) -> int: ...

    @abc.abstractmethod
    def keys(self) -> np.ndarray: ...

    @abc.abstractmethod
    def labels(self) -> np.ndarray: ...

    @abc.abstractmethod
    def read(self, i: int) -> tuple[Any, Any]: ...

    @abc.abstractmethod
    def fingerprint(self) -> dict: ...

    @property
    def sample_spec(self) -> ArraySpec:
        return DECODED_SPEC

    @property
    def label_spec(self) -> ArraySpec:
        lab = self.labels()
        return ArraySpec(tuple(lab.shape[1:]), lab.dtype.name)

    def describe(self, i: int) -> str:
        return f"key {self.key(i)} (position {i})"

    def reader(self, indices: np.ndarray | None = None) -> Callable[[int], tuple[Any, Any, int]]:
        """``f(i) -> (payload, label, key)``: what a worker calls per sample. The loader makes
        one per chunk of a batch and passes the chunk's ``indices``, so a source can check its
        files once per chunk rather than per sample (and look the indices up all at once); the
        same samples, labels, keys and errors as ``read`` and ``key``, for any ``i``."""
        read, key = self.read, self.key

        def get(i: int) -> tuple[Any, Any, int]:
            k = key(i)
            payload, label = read(i)
            return payload, label, k

        return get

    def share(self) -> None:  # noqa: B027 - optional hook
        """Make the source ready to cross to worker processes; the loader calls it before it
        starts workers. Nothing to do for a source that pickles as its configuration (the
        default); :class:`ArraySource` copies its arrays into shared memory here."""

    def load(self, i: int) -> tuple[np.ndarray, Any]:
        payload, label = self.read(i)
        return (decode(payload) if self.encoded else payload), label

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class RecordSource(Source):
    """Records from a ``.rec`` (with its ``.idx``) or a ``NAME.stoker.json`` manifest.

    The label is the record's IRHeader label (int64 when every label is a whole number, else
    float32); the key is the record key from the index.
    """

    encoded = True

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._rec: Any = None
        self._labels: np.ndarray | None = None
        self._label_dtype = ""  # set when unpickled in a worker (see __getstate__)
        self._label_shape: tuple[int, ...] = ()
        self._keys: np.ndarray | None = None
        self._len = len(self._records())

    def _records(self) -> Any:
        if self._rec is None:
            from stoker.formats.recordio import open_records

            # the image records only: an insightface set's header and identity records
            # (record 0 and those after the images) are not samples
            self._rec = open_records(self.path).images()
        return self._rec

    def __getstate__(self) -> dict:
        # Not the label array: a worker reads each label from the header it parses anyway,
        # so its start-up and memory do not grow with the dataset (5.8M labels are 46 MB).
        lab = self.labels()
        return {
            "path": self.path,
            "_len": self._len,
            "_label_dtype": lab.dtype.name,
            "_label_shape": tuple(lab.shape[1:]),
        }

    def __setstate__(self, state: dict) -> None:
        self.path = state["path"]
        self._len = state["_len"]
        self._label_dtype = state["_label_dtype"]
        self._label_shape = state["_label_shape"]
        self._labels = None
        self._rec = None
        self._keys = None

    def __len__(self) -> int:
        return self._len

    def key(self, i: int) -> int:
        return int(self._records().key(i))

    def keys(self) -> np.ndarray:
        if self._keys is None:
            self._keys = np.asarray(self._records().keys, dtype=np.int64)
        return self._keys

    def labels(self) -> np.ndarray:
        if self._labels is None:
            self._labels = _integral_labels(np.asarray(self._records().labels()))
        return self._labels

    def read(self, i: int) -> tuple[Any, Any]:
        header, image = self._records().read_header(i)
        if not self._label_dtype:  # the process that opened the source holds every label
            return image, self.labels()[i]
        # a worker: as labels() gives it (int64 class ids when the dataset's labels are whole)
        if self._label_shape:
            return image, np.asarray(header.label, self._label_dtype).reshape(self._label_shape)
        return image, self._scalar_label(header.label)

    @property
    def _scalar_label(self) -> Any:
        """A worker's conversion of a one-float header label to what ``labels()`` holds."""
        return int if self._label_dtype == "int64" else np.float32

    def reader(self, indices: np.ndarray | None = None) -> Callable[[int], tuple[Any, Any, int]]:
        # In a worker, single-part records with one label take RecordFile.plain_reader: one
        # unpack for both headers, no per-sample fstat. Any other record (and every error)
        # goes the way of read().
        slow = super().reader()
        if not self._label_dtype or self._label_shape:
            return slow
        make = getattr(self._records(), "plain_reader", None)  # not on sets of several shards
        plain = make(indices) if make is not None else None
        if plain is None:
            return slow
        as_label = self._scalar_label

        def get(i: int) -> tuple[Any, Any, int]:
            got = plain(i)
            if got is None:
                return slow(i)
            label, image, key = got
            return image, as_label(label), key

        return get

    @property
    def class_names(self) -> list[str] | None:
        names = getattr(self._records(), "class_names", None)
        return list(names) if names else None

    def describe(self, i: int) -> str:
        rec = self._records()
        where = f"key {rec.key(i)} (position {i}) of {self.path}"
        try:
            where += f", byte offset {rec.offset(i)}"
        except Exception:  # noqa: BLE001 - best effort for a message
            pass
        return where

    def fingerprint(self) -> dict:
        size = 0
        rec_path = self.path
        try:
            size = os.path.getsize(rec_path)
        except OSError:
            pass
        return {
            "type": "records",
            "len": self._len,
            "bytes": size,
            "sha": _sha(self.keys().tobytes(), self.labels().tobytes()),
        }

    def close(self) -> None:
        if self._rec is not None:
            self._rec.close()
            self._rec = None


class FolderSource(Source):
    """An image folder read directly: one class per top-level subfolder (sorted by name).

    The folder is listed by :func:`stoker._core.files.scan_folder` (the walk ``stoker pack``
    uses: image extensions, hidden names and symlinks are treated the same way); the key of a
    file is its position in that listing, and its label the class index. ``class_names`` holds
    the folder names, ``files`` the paths relative to ``root``.
    """

    encoded = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"image folder {self.root} does not exist")
        scan = scan_folder(self.root)
        if not scan.classes or not scan.items:  # files directly under root are no class
            raise FileNotFoundError(
                f"no images in {self.root}: expected one subfolder per class holding "
                f"{', '.join(sorted(IMAGE_EXTENSIONS))} files"
            )
        self.class_names = sorted(scan.classes, key=scan.classes.__getitem__)
        self.files = [item.rel for item in scan.items]
        self._labels = np.asarray([item.label for item in scan.items], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.files)

    def key(self, i: int) -> int:
        if not 0 <= i < len(self.files):
            raise IndexError(f"position {i} out of range for {len(self.files)} files")
        return int(i)

    def keys(self) -> np.ndarray:
        return np.arange(len(self.files), dtype=np.int64)

    def labels(self) -> np.ndarray:
        return self._labels

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.files[i])

    def read(self, i: int) -> tuple[Any, Any]:
        with open(self.path(i), "rb") as f:
            data = f.read()
        return data, self._labels[i]

    def describe(self, i: int) -> str:
        return f"key {i} ({self.path(i)})"

    def fingerprint(self) -> dict:
        listing = "\n".join(self.files).encode("utf-8", "surrogateescape")
        return {"type": "folder", "len": len(self.files), "sha": _sha(listing)}


_ARRAY_DTYPES = ("uint8", "float16", "float32")


def _release(segment: Segment | None, pid: int) -> None:
    if segment is not None and os.getpid() == pid:  # not from a forked child
        segment.unlink()


class ArraySource(Source):
    """In-memory images ``x`` (N, H, W) or (N, H, W, C) of uint8/float16/float32 and labels
    ``y`` (N, ...): nothing to decode.

    ``share()`` copies both once into a shared-memory segment (the loader calls it when it
    starts workers); workers then map it read-only and only the segment's name is pickled.
    The segment is removed by ``close()`` or when the source is garbage-collected.
    """

    encoded = False

    def __init__(self, x: Any, y: Any = None) -> None:
        x = np.asarray(x)
        if x.ndim not in (3, 4):
            raise ValueError(f"x must have shape (N, H, W) or (N, H, W, C), got {x.shape}")
        if x.dtype.name not in _ARRAY_DTYPES:
            raise TypeError(f"x must be one of {', '.join(_ARRAY_DTYPES)}, got {x.dtype}")
        if y is None:
            y = np.zeros(len(x), dtype=np.int64)
        y = np.asarray(y)
        if y.ndim == 0 or len(y) != len(x):
            raise ValueError(
                f"y must have one entry per image: x has {len(x)}, y has shape {y.shape}"
            )
        if y.dtype.kind not in "biuf":
            raise TypeError(f"y must be numeric, got {y.dtype}")
        self._x: np.ndarray = x
        self._y: np.ndarray = y
        self._x_shape = tuple(x.shape)
        self._x_dtype = x.dtype.name
        self._y_shape = tuple(y.shape)
        self._y_dtype = y.dtype.name
        self.segment: Segment | None = None
        self._finalizer: Any = None
        self._mapping: Any = None
        self._fp: dict | None = None

    @property
    def shared(self) -> bool:
        return self.segment is not None

    def _y_offset(self) -> int:
        return (self._x.nbytes + 63) // 64 * 64

    def share(self) -> None:
        """Copy ``x`` and ``y`` into a shared-memory segment (once; later calls do nothing)."""
        if self.segment is not None:
            return
        size = self._y_offset() + self._y.nbytes
        preflight(size, slots=1, what="array copies")
        seg, mapping = create_segment(size)
        self._finalizer = weakref.finalize(self, _release, seg, os.getpid())
        mem = mapping.array()
        xs = mem[: self._x.nbytes].view(self._x_dtype).reshape(self._x_shape)
        np.copyto(xs, self._x)
        ys = mem[self._y_offset() : self._y_offset() + self._y.nbytes].view(self._y_dtype)
        ys = ys.reshape(self._y_shape)
        np.copyto(ys, self._y)
        self.segment = seg
        self._mapping = mapping
        self._x, self._y = xs, ys

    def __getstate__(self) -> dict:
        if self.segment is None:
            raise TypeError(
                "an ArraySource crosses to worker processes only after share() placed it in "
                "shared memory"
            )
        return {
            "segment": self.segment,
            "x": (self._x_shape, self._x_dtype),
            "y": (self._y_shape, self._y_dtype),
            "fp": self.fingerprint(),
        }

    def __setstate__(self, state: dict) -> None:
        self.segment = state["segment"]
        self._x_shape, self._x_dtype = state["x"]
        self._y_shape, self._y_dtype = state["y"]
        self._fp = state["fp"]
        self._finalizer = None  # the worker does not own the segment
        mapping = self.segment.attach(writable=False)
        mem = mapping.array()
        nx = int(np.prod(self._x_shape)) * np.dtype(self._x_dtype).itemsize
        self._x = mem[:nx].view(self._x_dtype).reshape(self._x_shape)
        yo = (nx + 63) // 64 * 64
        ny = int(np.prod(self._y_shape)) * np.dtype(self._y_dtype).itemsize
        self._y = mem[yo : yo + ny].view(self._y_dtype).reshape(self._y_shape)
        self._mapping = mapping

    def __len__(self) -> int:
        return self._x_shape[0]

    def key(self, i: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(f"position {i} out of range for {len(self)} arrays")
        return int(i)

    def keys(self) -> np.ndarray:
        return np.arange(len(self), dtype=np.int64)

    def labels(self) -> np.ndarray:
        return self._y

    @property
    def sample_spec(self) -> ArraySpec:
        return ArraySpec(self._x_shape[1:], self._x_dtype)

    def read(self, i: int) -> tuple[Any, Any]:
        return self._x[i], self._y[i]

    def describe(self, i: int) -> str:
        return f"key {i} (row {i} of the arrays)"

    def fingerprint(self) -> dict:
        if self._fp is None:
            x = self._x
            ends = (
                b"".join(np.ascontiguousarray(x[j]).tobytes() for j in (0, -1)) if len(x) else b""
            )
            self._fp = {
                "type": "arrays",
                "len": len(x),
                "shape": list(self._x_shape),
                "dtype": self._x_dtype,
                "sha": _sha(ends, np.ascontiguousarray(self._y).tobytes()),
            }
        return self._fp

    def close(self) -> None:
        """Remove the shared copy (only in the process that made it, never in a fork)."""
        info = self._finalizer.peek() if self._finalizer is not None else None
        if info is not None and info[2][1] == os.getpid():
            self._finalizer()
            self._finalizer = None


def as_source(source: Any) -> tuple[Source, bool]:
    """``(Source, owned)`` for what ``Loader`` accepts: a path, an ``(x, y)`` tuple, a Source.

    ``owned`` is True when the source was made here (the loader then closes it).
    """
    if isinstance(source, Source):
        return source, False
    if isinstance(source, tuple):
        if len(source) != 2:
            raise ValueError(f"an array source is a tuple (x, y), got {len(source)} items")
        return ArraySource(*source), True
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        if os.path.isdir(path):
            return FolderSource(path), True
        if path.endswith((".rec", ".idx", ".json")):
            return RecordSource(path), True
        if not os.path.exists(path):
            raise FileNotFoundError(f"source {path} does not exist")
        raise ValueError(
            f"source {path}: expected a .rec, a .stoker.json manifest or an image folder"
        )
    raise TypeError(
        "source must be a path (.rec, .stoker.json, image folder), a tuple (x, y) of arrays "
        f"or a stoker Source, got {type(source).__name__}"
    )
