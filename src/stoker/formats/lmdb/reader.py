"""``LmdbReader``: an LMDB database (Caffe ``Datum`` or LSUN-style key -> image) as a
:class:`~stoker.formats.base.Reader`.

Sample ``i`` is the ``i``-th key in LMDB's order (keys sorted as bytes), found through the key
list (:mod:`.keylist`); the Reader's integer keys are these positions, since LMDB keys are
bytes (``describe(i)`` and every error name the LMDB key itself, ``lmdb_key(i)`` returns it).
The environment opens in the process that reads (:mod:`.env`); the reader pickles as its path
and options, and a worker maps the cached key list rather than walking the database again.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from stoker._core.schema import Schema
from stoker.codecs import encode_png as png_of
from stoker.formats.base import Reader, ReadSample, no_fields
from stoker.formats.lmdb.env import EnvHandle
from stoker.formats.lmdb.keylist import KeyList, load_keys
from stoker.formats.lmdb.labels import (
    cached_labels,
    check_label_options,
    file_tag,
    labels_for_keys,
    read_label_file,
)
from stoker.formats.lmdb.location import (
    LmdbFormatError,
    damaged,
    import_lmdb,
    locate,
    not_found,
    show_key,
)
from stoker.formats.lmdb.values import (
    check_layout,
    detect_layout,
    read_datum,
    read_datum_label,
    read_image_value,
)

__all__ = ["LmdbReader", "open_reader"]


class LmdbReader(Reader):
    """See the module docstring and ``open_reader``."""

    format = "lmdb"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        layout: str | None = None,
        label: int | None = None,
        labels: Mapping[Any, int] | str | os.PathLike[str] | None = None,
        class_names: list[str] | None = None,
        png_level: int = 0,
    ) -> None:
        self.path = os.fspath(path)
        layout = check_layout(layout)
        if isinstance(png_level, bool) or not isinstance(png_level, int) or not 0 <= png_level <= 9:
            raise ValueError(f"png_level must be an int in 0..9, got {png_level!r}")
        self._label, self._labels_opt, self._class_names = check_label_options(
            label, labels, class_names
        )
        self._png_level = png_level
        self._handle = EnvHandle(locate(self.path))
        self._keys: KeyList | None = None
        self._label_arr: np.ndarray | None = None
        keys = self._keylist()
        if len(keys) == 0:
            raise LmdbFormatError(self.path, "the database has 0 records")
        if layout is None:
            k = keys.key(0)
            layout = detect_layout(self._get(k, 0), self.path, k)
        if layout == "datum" and (label is not None or labels is not None):
            raise ValueError(
                "a Datum database carries its own labels; label=/labels= are for layout='image'"
            )
        self.layout: str = layout
        # an encoded Datum gives its bytes, a raw one its decoded pixels: per sample
        self.encoded = None if layout == "datum" else True

    # ------------------------------------------------------------------ process-local state

    def _env(self) -> Any:
        return self._handle.get()

    def _get(self, k: bytes, i: int) -> Any:
        """The value of LMDB key ``k`` (position ``i``), in a transaction of its own."""
        lmdb = import_lmdb()
        try:
            with self._env().begin() as txn:
                value = txn.get(k)
        except lmdb.Error as e:
            raise damaged(self._handle.loc.data_file, e, key=k, position=i) from None
        if value is None:
            raise not_found(self.path, k, i)
        return value

    def _keylist(self) -> KeyList:
        if self._keys is None:
            self._keys = load_keys(self._env(), self._handle.loc.data_file)
        return self._keys

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_keys"] = None
        state["_label_arr"] = None
        state.pop("_image_sizes", None)  # read again where needed, never shipped
        return state

    # ------------------------------------------------------------------ the Reader contract

    def __len__(self) -> int:
        return len(self._keylist())

    def keys(self) -> np.ndarray:
        return np.arange(len(self), dtype=np.int64)

    def key(self, i: int) -> int:
        return self._position(i)

    def lmdb_key(self, i: int) -> bytes:
        """The LMDB key (bytes) of sample ``i``."""
        return self._keylist().key(self._position(i))

    def _position(self, i: int) -> int:
        n = len(self)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n:
            raise IndexError(f"position {i!r} out of range for {n} records of {self.path}")
        return int(i)

    @property
    def schema(self) -> Schema:
        return Schema.classification((), "int64")

    @property
    def class_names(self) -> list[str] | None:
        return None if self._class_names is None else list(self._class_names)

    def labels(self) -> np.ndarray:
        if self._label_arr is None:
            self._label_arr = self._compute_labels()
        return self._label_arr

    def _compute_labels(self) -> np.ndarray:
        keys, env = self._keylist(), self._env()
        n, txnid = len(keys), int(env.info()["last_txnid"])
        data_file = self._handle.loc.data_file
        if self.layout == "datum":
            return cached_labels(data_file, "datum", n, txnid, self._datum_labels)
        opt = self._labels_opt
        if isinstance(opt, str):
            path = opt

            def from_file() -> np.ndarray:
                return labels_for_keys(
                    keys, read_label_file(path), f"the label list {path}", self.path
                )

            return cached_labels(data_file, file_tag(path), n, txnid, from_file)
        if opt is not None:
            return labels_for_keys(keys, opt, "labels=", self.path)
        return np.full(n, self._label or 0, dtype=np.int64)

    def _datum_labels(self) -> np.ndarray:
        """One pass in key order reading only each Datum's fields (the pixels are skipped)."""
        keys = self._keylist()
        out = np.empty(len(keys), dtype=np.int64)
        lmdb = import_lmdb()
        i = 0
        with self._env().begin(buffers=True) as txn:
            try:
                for k, v in txn.cursor().iternext(keys=True, values=True):
                    if i >= len(out) or bytes(k) != keys.key(i):
                        raise LmdbFormatError(
                            self.path,
                            "the database changed while its labels were read",
                            key=bytes(k),
                            position=i,
                        )
                    out[i] = read_datum_label(v, self.path, bytes(k), i)
                    i += 1
            except lmdb.Error as e:
                raise damaged(self._handle.loc.data_file, e, position=i) from None
        if i != len(out):
            raise LmdbFormatError(
                self.path, f"the database holds {i} records, its key list {len(out)}"
            )
        return out

    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()) -> ReadSample:
        no_fields(self, fields)
        lmdb = import_lmdb()
        keys, path, n = self._keylist(), self.path, len(self)
        env, data_file = self._env(), self._handle.loc.data_file
        txn = env.begin()  # one read transaction per chunk; aborted when f goes
        datum = self.layout == "datum"
        const = self._label or 0
        mapping = self._labels_opt if isinstance(self._labels_opt, dict) else None
        table = self.labels() if isinstance(self._labels_opt, str) else None

        def f(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            nonlocal txn
            if isinstance(i, bool) or not 0 <= i < n:
                raise IndexError(f"position {i!r} out of range for {n} records of {path}")
            i = int(i)
            k = keys.key(i)
            try:
                value = txn.get(k)
            except lmdb.Error as e:
                # liblmdb's error leaves the transaction unusable; the next record gets a new one
                txn.abort()
                txn = env.begin()
                raise damaged(data_file, e, key=k, position=i) from None
            if value is None:
                raise not_found(path, k, i)
            if datum:
                image, label = read_datum(value, path, k, i)
                return image, label, i, {}
            image = read_image_value(value, path, k, i)
            if table is not None:
                label = int(table[i])
            elif mapping is not None:
                label = mapping.get(k)  # type: ignore[assignment]
                if label is None:
                    raise LmdbFormatError(path, "has no label in labels=", key=k, position=i)
            else:
                label = const
            return image, label, i, {}

        return f

    def stored_bytes(self, image: Any) -> bytes | memoryview:
        """A raw Datum's pixels as the PNG ``png_level`` says (what convert writes and unpack
        saves); encoded images as they are."""
        if isinstance(image, np.ndarray):
            return png_of(image, self._png_level)
        return image

    def describe(self, i: int) -> str:
        keys = self._keylist()
        try:
            k = show_key(keys.key(int(i))) if 0 <= int(i) < len(keys) else "(out of range)"
        except (TypeError, ValueError):
            k = "?"
        return f"LMDB key {k} (position {i}) of {self.path}"

    def files(self) -> list[str]:
        """The data file (``data.mdb``, or the single file); ``lock.mdb`` holds no samples."""
        return [self._handle.loc.data_file]

    def summary(self) -> dict:
        """What ``stoker inspect`` shows beyond counts: the layout, the data file's size, the
        labels' source and a few keys."""
        keys = self._keylist()
        opt = self._labels_opt
        source = (
            "each Datum"
            if self.layout == "datum"
            else f"the list {opt}"
            if isinstance(opt, str)
            else "labels= mapping"
            if opt is not None
            else f"one class ({self._label or 0})"
        )
        try:
            size = os.path.getsize(self._handle.loc.data_file)
        except OSError:
            size = None
        return {
            "layout": self.layout,
            "data_file": self._handle.loc.data_file,
            "data_bytes": size,
            "labels_from": source,
            "first_keys": [show_key(keys.key(i)) for i in range(min(3, len(keys)))],
        }

    def fingerprint(self) -> dict:
        keys = self._keylist()
        h = hashlib.sha256(keys.digest())
        h.update(self.labels().astype("<i8").tobytes())
        return {
            "format": "lmdb",
            "layout": self.layout,
            "len": len(keys),
            "sha": h.hexdigest()[:32],
        }

    def close(self) -> None:
        keys, self._keys = self._keys, None
        if keys is not None:
            keys.close()
        self._handle.close()

    def __repr__(self) -> str:
        return f"LmdbReader({self.path!r}, layout={self.layout!r})"


def open_reader(path: str | os.PathLike[str], **options: Any) -> LmdbReader:
    """The registry's entry: ``open_reader(path, layout=None, label=None, labels=None,
    class_names=None, png_level=0)``. ``path``: a folder holding ``data.mdb``, or an LMDB data
    file (``*.mdb``/``*.lmdb``, opened with ``subdir=False``). ``layout``: ``"datum"`` (Caffe)
    or ``"image"`` (LSUN-style), detected from the first value when ``None``. ``label``,
    ``labels``, ``class_names``: an image database's labels (see :mod:`.labels`).
    ``png_level``: the deflate level of the PNG a raw Datum's pixels become where bytes are
    needed (``stoker convert``, ``stoker unpack``; 0: stored, fastest); the loader takes the
    pixels themselves."""
    return LmdbReader(path, **options)
