"""The source contract: random access to samples by global position.

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
- ``s.share()``: called by the loader before it starts workers (a no-op by default);
- ``s.schema``: the :class:`~stoker._core.schema.Schema` of one sample (default: an image and
  its label, ``Schema.classification``); ``s.field_reader(names, indices) -> f``, ``f(i) ->
  (payload, label, key, fields)``: ``reader`` plus a dict of the stored fields ``names`` (each
  value as ``Field.check`` returns it: bytes for a mask, an ndarray for numeric and ragged
  fields, a str for text); the loader uses it only when a batch carries fields;
- ``s.image_sizes()``: int32 ``(N, 2)`` stored (height, width) of every sample, read from the
  image headers (what aspect-ratio buckets need), cached on the source;
- ``s.shard_sizes()``: int64 samples per shard in position order (positions run through the
  shards in order), or ``None`` for a source without shards (arrays, an image folder): what
  ``shuffle="shards"`` deals to the ranks;
- ``s.read_ahead(order, start)``: downloads ahead of the reading order for a set in object
  storage (an object with ``reached(p)`` and ``close()``), ``None`` by default;
- ``s.claim_cache(plan)`` and ``s.let_go()``: a set read through the node's shard cache claims
  the room its loader's plan needs at open, and lets go of what the main process pinned once
  the workers read (``docs/remote.md``); nothing by default.

Sources pickle as their configuration (a path, a file list, a shared-memory segment name) and
reopen in the worker; no open handle or large array crosses a process boundary.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.errors import ImageDecodeError, SpecError
from stoker._core.schema import Schema
from stoker._core.specs import ArraySpec
from stoker.codecs import DECODED_SPEC, decode

__all__ = ["PositionKeyed", "Source", "integral_labels", "sha"]


def sha(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()[:32]


def integral_labels(labels: np.ndarray) -> np.ndarray:
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

    @property
    def schema(self) -> Schema:
        """The fields of one sample; a source without declared fields has an image and a label."""
        lab = self.label_spec
        return Schema.classification(tuple(int(d or 1) for d in lab.shape), lab.dtype)

    def field_reader(
        self, names: tuple[str, ...], indices: np.ndarray | None = None
    ) -> Callable[[int], tuple[Any, Any, int, dict[str, Any]]]:
        """``f(i) -> (payload, label, key, fields)``: :meth:`reader` plus the stored fields
        ``names`` (see the module docstring). A source with no stored fields has only ``()``."""
        if names:
            raise SpecError(
                f"{type(self).__name__} stores no fields beyond the image and the label; "
                f"asked for {list(names)}"
            )
        get = self.reader(indices)

        def read(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            payload, label, key = get(i)
            return payload, label, key, {}

        return read

    def image_sizes(self) -> np.ndarray:
        """int32 ``(N, 2)``: the stored (height, width) of every sample, from the image headers
        (arrays: their shape), computed once and kept on the source."""
        cached = getattr(self, "_image_sizes", None)
        if cached is not None:
            return cached
        n = len(self)
        out = np.empty((n, 2), dtype=np.int32)
        if not self.encoded:
            for i in range(n):
                out[i] = np.shape(self.read(i)[0])[:2]
        else:
            from stoker._core.progress import make_progress
            from stoker.codecs import image_size

            bar = make_progress(n, "reading image sizes")
            try:
                for i in range(n):
                    try:
                        out[i] = image_size(self.read(i)[0])
                    except ImageDecodeError as e:  # name the sample
                        raise ImageDecodeError(f"{self.describe(i)}: {e}") from e
                    bar.update(1)
            finally:
                bar.close()
        self._image_sizes = out
        return out

    def describe(self, i: int) -> str:
        return f"key {self.key(i)} (position {i})"

    def read_ahead(self, order: np.ndarray, start: int = 0) -> Any:
        """An object with ``reached(p)`` and ``close()`` that fetches what ``order`` (global
        positions in reading order) needs ahead of the reader, from position ``start``; the
        loader calls ``reached`` as batches are delivered. ``None`` (the default): nothing to
        fetch."""
        return None

    def shard_sizes(self) -> np.ndarray | None:
        """Samples per shard in position order; ``None``: the source has no shards."""
        return None

    def claim_cache(self, plan: Any) -> Any:
        """For a set read through a shard cache, claim the room ``plan``
        (:class:`~stoker.formats.remote.ReadPlan`) needs, or raise ``CacheFullError``; an
        object with ``close()``, or ``None`` (the default: nothing cached)."""
        return None

    def let_go(self) -> None:
        """This process reads nothing more for now (the workers read): release what the
        source holds for reading, such as pinned cached shards. The default holds nothing."""
        return None

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
        default); :class:`ArraySource` copies its arrays into shared memory here, and
        :class:`FolderSource` its listing."""

    def load(self, i: int) -> tuple[np.ndarray, Any]:
        payload, label = self.read(i)
        return (decode(payload) if self.encoded else payload), label

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class PositionKeyed(Source):
    """A source whose sample keys are their positions (a folder listing, array rows)."""

    _unit = "samples"  # what a position counts, in the out-of-range message

    def key(self, i: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(f"position {i} out of range for {len(self)} {self._unit}")
        return int(i)

    def keys(self) -> np.ndarray:
        return np.arange(len(self), dtype=np.int64)
