"""RecordIO behind the format-neutral :class:`~stoker.formats.base.ShardWriter`: what ``stoker
pack --format recordio`` and ``stoker convert`` write through.

A sample ``(key, image, label, fields)`` becomes one dmlc record whose payload is the
``IRHeader`` (``flag`` 0 and the label in ``label`` for one number; ``flag`` k and k float32
labels after the header for a label vector; ``id`` the key, ``id2`` 0), the image bytes as
given, and the field trailer when the set's schema stores fields (``docs/format.md``). These
are the bytes ``stoker pack`` has always written, so a set packed through this writer is
byte-identical to one packed before formats were plug-ins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stoker._core.schema import Schema
from stoker.formats.base import ShardWriter
from stoker.formats.manifest import write_set
from stoker.formats.recordio.header import IR_SIZE, IRHeader, pack_header, pack_headers
from stoker.formats.recordio.insightface import layout_records
from stoker.formats.recordio.manifest import KIND, shard_entry
from stoker.formats.recordio.writer import RecordWriter

__all__ = ["RecordShardWriter", "header_payload", "open_writer", "shard_path", "write_set_manifest"]


def shard_path(prefix: str, shard: int | None) -> str:
    """The ``.rec`` of shard ``shard`` under ``prefix`` (``None``: the one unsharded file)."""
    return prefix + ".rec" if shard is None else f"{prefix}-{shard:05d}.rec"


def header_payload(key: int, label: Any, image: bytes | memoryview) -> bytes:
    """``IRHeader`` + labels + image: a record's payload before any field trailer. A label
    that is a sequence or a 1-d array is a label vector (``flag`` = its length)."""
    if isinstance(label, (tuple, list)) or (isinstance(label, np.ndarray) and label.ndim > 0):
        vec = np.asarray(label, np.float32).reshape(-1)
        return pack_header(IRHeader(len(vec), vec, key, 0), image)
    return pack_header(IRHeader(0, float(label), key, 0), image)


class RecordShardWriter(ShardWriter):
    """One ``.rec`` + ``.idx`` (+ ``.crc32c``) shard written through :class:`RecordWriter`
    (atomic ``*.partial`` until :meth:`commit`)."""

    def __init__(
        self,
        rec_path: str,
        *,
        schema: Schema | None,
        checksums: bool = True,
    ) -> None:
        self.rec_path = rec_path
        self.schema = schema
        # the trailer is built by RecordWriter only when the schema stores fields
        stores = schema is not None and bool(schema.stored)
        self._w = RecordWriter(
            rec_path,
            overwrite=True,
            checksums=checksums,
            schema=schema if stores else None,
        )
        self._stores = stores

    @property
    def files(self) -> tuple[str, ...]:
        """The final files this shard writes."""
        w = self._w
        return tuple(p for p in (w.rec_path, w.idx_path, w.crc_path) if p is not None)

    def write(
        self,
        key: int,
        image: bytes | memoryview,
        label: Any,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        """Append one sample; ``ValueError`` naming the shard and the key when it cannot be
        stored (over RecordIO's 2^29-1 byte record limit, a field the schema does not have)."""
        payload = header_payload(key, label, image)
        if self._stores:
            self._w.write(key, payload, fields or {})
        else:
            self._w.write(key, payload)

    def write_batch(
        self, keys: Sequence[int], images: Sequence[bytes], labels: Sequence[Any]
    ) -> bool:
        """Samples of one-number labels in a set without stored fields, framed in one go
        (:meth:`RecordWriter.write_batch`: the same bytes); ``False`` for any other batch."""
        if self._stores:
            return False
        try:
            k, lab = np.asarray(keys), np.asarray(labels)
        except (ValueError, OverflowError):  # ragged label vectors, keys past int64
            return False
        if k.dtype.kind not in "iu" or lab.dtype.kind not in "iufb":  # one number a label
            return False
        heads = pack_headers(k, lab)
        return heads is not None and self._w.write_batch(k, heads, IR_SIZE, images)

    def write_layout(self, layout: str, labels: np.ndarray) -> None:
        """Append the records of ``layout`` after the images: ``"insightface"``, the header
        record and one identity record per run of equal ``labels`` (the images' labels in key
        order; the images must be keys ``1..N``), as :func:`~.insightface.layout_records`
        makes them."""
        if layout != "insightface":
            raise ValueError(f"layout {layout!r}: RecordIO writes 'plain' or 'insightface'")
        keys = self._w.keys_written
        n = int(np.asarray(labels).size)
        if keys.shape[0] != n or not np.array_equal(keys, np.arange(1, n + 1)):
            raise ValueError(
                f"{self.rec_path}: an insightface layout needs the images at keys 1..{n}, "
                f"in order; {keys.shape[0]} records were written"
            )
        for key, payload in layout_records(labels):
            self._w.write(key, payload)

    @property
    def keys_written(self) -> np.ndarray:
        return self._w.keys_written

    @property
    def bytes_written(self) -> int:
        return int(self._w.bytes_written)

    def commit(self) -> dict:
        """Rename the shard's files into place; its manifest entry (paths relative to the
        folder of the shard, which is the manifest's)."""
        info = self._w.commit()
        return shard_entry(info, info.rec)

    def abort(self) -> None:
        """Stop and remove the partials."""
        self._w.abort()


def open_writer(
    prefix: str,
    shard: int | None,
    *,
    schema: Schema | None,
    checksums: bool = True,
) -> RecordShardWriter:
    """The writer of shard ``shard`` (``PREFIX-NNNNN.rec``; ``None``: ``PREFIX.rec``)."""
    return RecordShardWriter(
        shard_path(os.fspath(prefix), shard), schema=schema, checksums=checksums
    )


def write_set_manifest(
    manifest_path: str, shards: Sequence[Mapping[str, Any]], **fields: Any
) -> None:
    """Write ``NAME.stoker.json`` for committed shards (checked, atomically); ``fields``:
    ``classes``, ``schema`` (``None``: a set of images and IRHeader labels, as every set
    packed from a folder is: no ``schema`` key), ``pack``, ``rejects``."""
    write_set(KIND, manifest_path, shards, **fields)
