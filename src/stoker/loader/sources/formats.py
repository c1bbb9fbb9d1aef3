"""Any format behind the seam as a source: a :class:`~stoker.formats.Reader` (RecordIO,
TFRecord, WebDataset, LMDB, or a format registered by the user) seen the way the loader reads.

The loader knows no format: it asks ``stoker.formats.open`` for a reader and reads samples,
labels, keys and fields through the reader's contract. A new format is a folder under
``stoker/formats`` and a registry line, with no change here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.errors import ImageDecodeError, SpecError
from stoker._core.schema import Schema
from stoker._core.specs import ArraySpec
from stoker.formats import Reader
from stoker.loader.sources.base import Source

__all__ = ["FormatSource", "empty_set_error"]


def empty_set_error(path: str) -> Exception:
    """The error for a set without a single sample: nothing to load (a manifest's is a
    :class:`ManifestError`, a data file's a :class:`CorruptRecordError`)."""
    from stoker._core.errors import CorruptRecordError, ManifestError
    from stoker.formats.manifest import MANIFEST_SUFFIX

    reason = "0 records: the set is empty, there is nothing to load"
    if path.endswith(MANIFEST_SUFFIX):
        return ManifestError(f"{path}: {reason}")
    return CorruptRecordError(path, None, reason)


class FormatSource(Source):
    """Samples of a :class:`~stoker.formats.Reader`: ``FormatSource(path, format=None,
    **options)`` opens ``path`` through the registry (``stoker.formats.open``), or
    ``FormatSource(reader)`` takes an open reader (the source closes it).

    Pickles as the reader's configuration (a reader reopens lazily in the process that uses
    it), so a worker never receives an open handle. An empty set is an error here: there is
    nothing to load.
    """

    encoded = True

    def __init__(
        self, source: str | os.PathLike[str] | Reader, *, format: str | None = None, **options: Any
    ) -> None:
        if isinstance(source, Reader):
            if format is not None or options:
                raise TypeError("format= and options apply to a path, not to an open Reader")
            reader = source
        else:
            from stoker.formats import open_reader

            reader = open_reader(source, format=format, **options)
        self._reader: Reader = reader
        self.path = reader.path or (os.fspath(source) if not isinstance(source, Reader) else "")
        self._len = len(reader)
        if self._len == 0:
            reader.close()
            raise empty_set_error(self.path)

    @property
    def format_reader(self) -> Reader:
        """The format's :class:`~stoker.formats.Reader` this source reads through."""
        return self._reader

    @property
    def format(self) -> str:
        """The registry name of the format (``"recordio"``, ``"tfrecord"``, ...)."""
        return self._reader.format

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_image_sizes", None)  # computed again where needed, never shipped
        return state

    def __len__(self) -> int:
        return self._len

    def key(self, i: int) -> int:
        return int(self._reader.key(i))

    def keys(self) -> np.ndarray:
        return self._reader.keys()

    def labels(self) -> np.ndarray:
        return self._reader.labels()

    @property
    def label_spec(self) -> ArraySpec:
        """One label's shape and dtype; from the reader's ``label_kind()`` where it has one
        (a remote set answers from its first shard, without fetching every shard)."""
        kind = getattr(self._reader, "label_kind", None)
        if kind is None:
            return super().label_spec
        shape, dtype = kind()
        return ArraySpec(tuple(shape), dtype)

    @property
    def class_names(self) -> list[str] | None:
        return self._reader.class_names

    @property
    def schema(self) -> Schema:
        return self._reader.schema

    def read(self, i: int) -> tuple[Any, Any]:
        payload, label, _key, _fields = self._reader.reader(np.array([i], np.int64))(i)
        return payload, label

    def reader(self, indices: np.ndarray | None = None) -> Callable[[int], tuple[Any, Any, int]]:
        f = self._reader.reader(indices, ())

        def get(i: int) -> tuple[Any, Any, int]:
            image, label, key, _ = f(i)
            return image, label, key

        return get

    def field_reader(
        self, names: tuple[str, ...], indices: np.ndarray | None = None
    ) -> Callable[[int], tuple[Any, Any, int, dict[str, Any]]]:
        """``f(i) -> (payload, label, key, fields)`` straight from the reader; names that are
        not stored fields of the set are a :class:`SpecError` here, before any read."""
        names = tuple(names)
        if names:
            stored = self.schema.stored
            unknown = [n for n in names if n not in stored]
            if unknown:
                raise SpecError(
                    f"{self.path}: no stored fields {unknown}; the set stores "
                    f"{list(stored) or 'none'}"
                )
        return self._reader.reader(indices, names)

    def image_sizes(self) -> np.ndarray:
        """int32 ``(N, 2)`` stored (height, width) from the image headers, read in one pass
        through one reader, computed once and kept on the source."""
        cached = getattr(self, "_image_sizes", None)
        if cached is not None:
            return cached
        from stoker._core.progress import make_progress
        from stoker.codecs import image_size

        n = len(self)
        out = np.empty((n, 2), dtype=np.int32)
        get = self._reader.reader(None, ())
        bar = make_progress(n, "reading image sizes")
        try:
            for i in range(n):
                try:
                    out[i] = image_size(get(i)[0])
                except ImageDecodeError as e:  # name the sample
                    raise ImageDecodeError(f"{self.describe(i)}: {e}") from e
                bar.update(1)
        finally:
            bar.close()
            self.let_go()
        self._image_sizes = out
        return out

    def describe(self, i: int) -> str:
        return self._reader.describe(i)

    def probe_positions(self, probes: int) -> list[int] | None:
        """Where to read a few images' sizes without fetching much: the reader's choice (a
        remote set's first shard), or ``None`` for a spread over the set."""
        near = getattr(self._reader, "probe_positions", None)
        return None if near is None else near(probes)

    def read_ahead(self, order: np.ndarray, start: int = 0) -> Any:
        """The reader's downloads ahead of ``order`` (a set in object storage), or ``None``."""
        ahead = getattr(self._reader, "read_ahead", None)
        return None if ahead is None else ahead(order, start)

    def claim_cache(self, plan: Any) -> Any:
        """The reader's claim on a shard cache for ``plan`` (a set in object storage), or
        ``None``."""
        claim = getattr(self._reader, "claim_cache", None)
        return None if claim is None else claim(plan)

    def let_go(self) -> None:
        """This process reads no more for now: the reader releases what it holds pinned."""
        let_go = getattr(self._reader, "let_go", None)
        if let_go is not None:
            let_go()

    def shard_sizes(self) -> np.ndarray | None:
        """The reader's records per shard (``None`` for a set without shards)."""
        return self._reader.shard_sizes()

    def fingerprint(self) -> dict:
        return self._reader.fingerprint()

    def close(self) -> None:
        self._reader.close()
