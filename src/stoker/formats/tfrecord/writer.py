"""Writing TFRecord shards of ``tf.train.Example`` records, atomically.

Records go to ``NAME.tfrecord.partial``; ``commit()`` flushes, fsyncs and renames it, so a
killed run never leaves a complete-looking shard (a shard that is not whole is written again
from scratch: ``docs/pack.md``, "Resume").

Each record holds ``image/encoded``, ``image/format`` (``jpeg``, ``png``, ... when the bytes
say so), ``image/height`` and ``image/width`` (from the image's header), the label in
``image/class/label`` (int64, or float for a float label), the record key in ``stoker/key``
and the schema's other fields where :func:`feature_names` puts them: boxes as the four
normalised ``image/object/bbox/*`` lists, numbers as int64 or float lists (float32: a float64
value that float32 cannot hold exactly is refused, not rounded), text as UTF-8 bytes, bytes
and masks as bytes.
"""

from __future__ import annotations

import contextlib
import operator
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stoker._core.atomic import fsync_dir, partial_path
from stoker._core.errors import SpecError
from stoker._core.schema import Field, Schema
from stoker.formats.base import ShardWriter
from stoker.formats.manifest import fail, longest, write_set
from stoker.formats.protowire import encode_varint
from stoker.formats.tfrecord.example import (
    bytes_entry_head,
    encode_example,
    feature_entry,
    int_entry,
)
from stoker.formats.tfrecord.features import (
    BOX_SUFFIXES,
    KEY_FEATURE,
    feature_names,
    image_hw,
    lengths_of,
)
from stoker.formats.tfrecord.framing import frame, frame_ends

__all__ = ["KIND", "TFRecordShardWriter", "open_writer", "shard_path", "write_set_manifest"]

#: the manifest's ``kind`` (the registry name: FORMAT.name)
KIND = "tfrecord"

_KEY_LIMIT = 1 << 63
_FORMATS = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF8", "gif"),
    (b"BM", "bmp"),
)


def _jpeg_hw(image: bytes) -> tuple[int, int] | None:
    """:func:`image_hw` of JPEG bytes, asking simplejpeg straight away (``image_hw``'s first
    try for a JPEG); ``None`` where :meth:`TFRecordShardWriter.write` leaves them out."""
    from simplejpeg import decode_jpeg_header

    try:
        try:
            h, w, _, _ = decode_jpeg_header(image)
            return int(h), int(w)
        except ValueError:
            return image_hw(image)  # Pillow may know better
    except Exception:  # noqa: BLE001 - no readable header
        return None


def shard_path(prefix: str | os.PathLike[str], shard: int | None) -> str:
    """``PREFIX.tfrecord`` (``shard=None``) or ``PREFIX-00007.tfrecord``."""
    p = os.fspath(prefix)
    return p + ".tfrecord" if shard is None else f"{p}-{int(shard):05d}.tfrecord"


def _image_format(image: bytes) -> str | None:
    for magic, name in _FORMATS:
        if image.startswith(magic):
            return name
    if image[:4] == b"RIFF" and image[8:12] == b"WEBP":
        return "webp"
    return None


_IMAGE = Field.image()


class TFRecordShardWriter(ShardWriter):
    """Writes one ``.tfrecord`` shard (see the module docstring)."""

    def _head_kind(self, f: Field, value: Any) -> str:
        """:func:`_kind` of the label: an integer header is ``int64`` whatever its value."""
        kind = getattr(self, "_int_head", None)
        if kind is None:
            kind = self._int_head = np.dtype(f.dtype).kind in "iu" and f.dtype != "uint64"
        return "int64" if kind else _kind(f, value, self._header or "label")

    def __init__(self, path: str, *, schema: Schema) -> None:
        self.path = os.fspath(path)
        self.schema = schema
        self.features = feature_names(schema)  # refuses what TFRecord cannot hold
        self._stored = [(n, self.features[n], f) for n, f in schema.stored.items()]
        self._header = schema.header_name
        self._keys: list[int] = []
        self._key_set: set[int] = set()
        self._max_len = {n: 0 for n, _ft, f in self._stored if f.variable}
        self._bytes = 0
        self._done = False
        self._file: Any = open(partial_path(self.path), "wb", buffering=1 << 20)  # noqa: SIM115

    # ------------------------------------------------------------------ writing
    @property
    def keys_written(self) -> np.ndarray:
        return np.asarray(self._keys, dtype=np.int64)

    @property
    def bytes_written(self) -> int:
        return self._bytes

    @property
    def count(self) -> int:
        return len(self._keys)

    def write(
        self,
        key: int,
        image: bytes | memoryview,
        label: Any,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        """Append one record: ``image`` (encoded bytes, kept as they are), ``label`` (the
        schema's header field; ``None`` when it has none), ``fields`` (the schema's stored
        fields, each checked with ``Field.check``)."""
        if self._done or self._file is None:
            raise ValueError(f"{self.path}: the writer is already committed or aborted")
        k = operator.index(key)
        if not 0 <= k < _KEY_LIMIT:
            raise ValueError(f"{self.path}: record keys must be integers in [0, 2**63), got {k}")
        if k in self._key_set:
            raise ValueError(f"{self.path}: key {k} was already written")
        try:
            record = self._example(k, bytes(image), label, dict(fields or {}))
        except SpecError as e:
            raise ValueError(f"{self.path}: key {k}: {e}") from None
        data = frame(record)
        self._file.write(data)
        self._keys.append(k)
        self._key_set.add(k)
        self._bytes += len(data)

    def write_batch(
        self, keys: Sequence[int], images: Sequence[bytes], labels: Sequence[Any]
    ) -> bool:
        """The records of a set with an int64 label and no stored fields, JPEG images, int
        labels and new keys, in one write: each Example's constant and repeated features
        encoded once (the same bytes :meth:`write` gives); ``False`` for any other batch."""
        if not self._batchable(keys, images, labels):
            return False
        entry: dict[tuple[str, int], bytes] = {}

        def ints(name: str, v: int) -> bytes:  # height, width and label repeat: made once
            got = entry.get((name, v))
            if got is None:
                got = entry[name, v] = int_entry(name, v)
            return got

        fmt = feature_entry("image/format", "bytes", _FORMATS[0][1].encode())
        label_name = self.features[self._header]  # type: ignore[index]
        records: list[bytes] = []
        for key, image, label in zip(keys, images, labels, strict=True):
            got = _jpeg_hw(image)
            hw = b"" if got is None else ints("image/height", got[0]) + ints("image/width", got[1])
            head = bytes_entry_head("image/encoded", len(image))
            tail = fmt + hw + ints(label_name, label) + int_entry(KEY_FEATURE, key)
            size = len(head) + len(image) + len(tail)
            example = b"".join((b"\x0a", encode_varint(size), head, image, tail))
            before, after = frame_ends(example)
            records += (before, example, after)
        blob = b"".join(records)
        self._file.write(blob)
        self._keys.extend(keys)
        self._key_set.update(keys)
        self._bytes += len(blob)
        return True

    def _batchable(
        self, keys: Sequence[int], images: Sequence[bytes], labels: Sequence[Any]
    ) -> bool:
        """Whether :meth:`write_batch` can write these: an int64 label and no stored fields,
        non-empty JPEG ``bytes``, int labels within int64, new keys."""
        head = self.schema[self._header] if self._header is not None else None
        if self._done or head is None or head.dtype != "int64" or head.shape != ():
            return False
        if self._stored or not all(type(v) is int for v in labels):
            return False
        if not -(1 << 63) <= min(labels) <= max(labels) < 1 << 63:
            return False
        jpeg = _FORMATS[0][0]
        if not all(type(x) is bytes and x.startswith(jpeg) for x in images):
            return False
        return self._new_keys(keys, self._key_set)

    def _example(self, key: int, image: bytes, label: Any, fields: dict[str, Any]) -> bytes:
        _IMAGE.check(image, name="image")
        feats: list[tuple[str, str, Any]] = [("image/encoded", "bytes", image)]
        fmt = _image_format(image)
        if fmt is not None:
            feats.append(("image/format", "bytes", fmt.encode()))
        try:
            h, w = image_hw(image)
        except Exception:  # noqa: BLE001 - no readable header: height and width left out
            hw = None
        else:
            hw = (h, w)
            feats += [("image/height", "int64", [h]), ("image/width", "int64", [w])]
        if self._header is not None:
            f = self.schema[self._header]
            value = f.check(label, name=self._header)
            feats.append((self.features[self._header], self._head_kind(f, value), value))
        elif label is not None and not (np.ndim(label) == 0 and label == -1):
            raise SpecError(f"a label {label!r} was given but the schema has no label field")
        feats.append((KEY_FEATURE, "int64", [key]))
        unknown = sorted(set(fields) - {n for n, _ft, _f in self._stored})
        if unknown:
            raise SpecError(f"the schema stores no fields {unknown}")
        for n, ft, f in self._stored:
            if n not in fields:
                raise SpecError(f"field {n!r} has no value")
            value = f.check(fields[n], name=n)
            if f.variable:
                self._max_len[n] = max(self._max_len[n], lengths_of(f, value))
            feats += _field_features(n, ft, f, value, hw)
        return encode_example(feats)

    # ------------------------------------------------------------------ finishing
    def commit(self) -> dict:
        """Make the shard final; its manifest entry ``{"files": {"data": absolute path},
        "records", "bytes", "checksums": {}, "max_len": {field: longest}}``
        (:func:`write_set_manifest` makes the path relative)."""
        if self._done:
            raise ValueError(f"{self.path}: the writer is already committed or aborted")
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except BaseException:
            self.abort()
            raise
        self._file.close()
        self._file = None
        self._done = True
        os.replace(partial_path(self.path), self.path)
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        return {
            "files": {"data": os.path.abspath(self.path)},
            "records": len(self._keys),
            "bytes": self._bytes,
            "checksums": {},
            "max_len": dict(self._max_len),
        }

    def abort(self) -> None:
        """Stop and remove the partial; the final file is never touched."""
        if self._done:
            return
        self._done = True
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial_path(self.path))

    def __del__(self) -> None:  # never leak a descriptor when a caller forgets
        f = getattr(self, "_file", None)
        if f is not None:
            with contextlib.suppress(Exception):
                f.close()


def _kind(f: Field, value: Any, name: str) -> str:
    """``int64`` or ``float`` for a numeric value; float64 only when float32 holds it."""
    if np.dtype(f.dtype).kind in "iu":
        if f.dtype == "uint64":
            raise SpecError(f"field {name!r}: uint64 does not fit TFRecord's int64 lists")
        return "int64"
    arr = np.asarray(value, dtype=np.float64)
    if f.dtype == "float64" and not np.array_equal(arr.astype(np.float32), arr):
        raise SpecError(
            f"field {name!r}: float64 values that float32 cannot hold exactly (TFRecord's float "
            "lists are float32); declare the field float32 to store them rounded"
        )
    return "float"


def _field_features(
    name: str, feat: str, f: Field, value: Any, hw: tuple[int, int] | None
) -> list[tuple[str, str, Any]]:
    if f.geometry == "boxes":
        if hw is None and len(value):
            raise SpecError(
                f"field {name!r}: the image's size cannot be read from its header, so its boxes "
                "cannot be normalised (TFRecord keeps them as fractions of the width and height)"
            )
        h, w = hw or (1, 1)
        norm = np.asarray(value, dtype=np.float64) / np.array([w, h, w, h], dtype=np.float64)
        return [(feat + s, "float", norm[:, c]) for c, s in enumerate(BOX_SUFFIXES)]
    if f.kind == "text":
        return [(feat, "bytes", value.encode("utf-8"))]
    if f.kind in ("bytes", "mask"):
        return [(feat, "bytes", value)]
    return [(feat, _kind(f, value, name), np.asarray(value).reshape(-1))]


def open_writer(
    prefix: str | os.PathLike[str],
    shard: int | None,
    *,
    schema: Schema,
    checksums: bool = True,
) -> TFRecordShardWriter:
    """The registry's writer: shard ``shard`` of the set under ``prefix`` (``None``: one
    unsharded ``PREFIX.tfrecord``). ``checksums`` is accepted for the common signature:
    every TFRecord carries its own CRCs."""
    del checksums
    return TFRecordShardWriter(shard_path(prefix, shard), schema=schema)


def write_set_manifest(
    manifest_path: str | os.PathLike[str],
    shards: Sequence[Mapping[str, Any]],
    *,
    classes: Mapping[str, int] | Sequence[str] | None = None,
    schema: Schema | None = None,
    pack: Mapping[str, Any] | None = None,
    rejects: Mapping[str, Any] | None = None,
) -> None:
    """Write the set's ``NAME.stoker.json`` (atomically) from its shards' ``commit()``
    entries, in order; each shard must lie inside the manifest's folder. ``schema`` gets
    each variable field's ``max_len`` from the shards."""
    mp = os.fspath(manifest_path)
    schema = schema if schema is not None else Schema.classification()
    seen = longest(shards)
    for n, f in schema.items():
        if f.variable:
            seen[n] = max(seen.get(n, 0), f.max_len or 0)
    if classes is not None and not isinstance(classes, Mapping):
        classes = {str(c): i for i, c in enumerate(classes)}
    try:
        features = feature_names(schema)
    except ValueError as e:
        raise fail(mp, str(e)) from None
    write_set(
        KIND,
        mp,
        shards,
        classes=classes,
        schema=schema.with_max_len(seen),
        options={"features": features, "key_feature": KEY_FEATURE},
        pack=pack,
        rejects=rejects,
    )
