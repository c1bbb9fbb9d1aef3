"""Writing WebDataset tar shards: :func:`open_writer` (one shard) and
:func:`write_set_manifest` (the set's ``NAME.stoker.json``).

A sample with key ``k`` becomes consecutive members named ``%09d`` of ``k`` (zero-padded so
names sort in key order) plus a suffix: the image (``.jpg``, ``.png``, ``.webp``... from its
first bytes; bytes of no image type are refused), ``.cls`` (the header label as a decimal
integer; a label that is not one whole number is refused), then each stored field
(``layout.field_suffixes``: text as UTF-8, bytes and masks as they are, numeric and ragged
values as a JSON array in ``.<name>.json``). Headers are plain ustar with fixed metadata
(``tarfmt.ustar_header``), so the same samples give the same bytes.

The shard is written to ``NAME.tar.partial`` one whole sample per write, and renamed on
``commit`` after the end-of-archive marker and the padding to 10240 bytes (a shard that is
not whole is written again from scratch: ``docs/pack.md``, "Resume").

``checksums=True`` (the default) also writes ``NAME.crc32c`` beside the tar: one little-endian
uint32 per sample, in tar order, the CRC32C of the sample's member data chained in member
order (:func:`sample_crc`; the layout of RecordIO's ``.crc32c``), which the reader checks on
every read. It is written atomically on ``commit``, before the tar is renamed, and named by the
manifest entry's ``crc32c``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections.abc import Mapping, Sequence
from typing import IO, Any

import numpy as np

from stoker._core.atomic import fsync_dir, partial_path, write_bytes_atomic
from stoker._core.errors import OutputExistsError, SpecError
from stoker._core.schema import Schema
from stoker.formats.base import ShardWriter
from stoker.formats.manifest import write_set
from stoker.formats.wds.layout import (
    LABEL_SUFFIX,
    common_suffix,
    crc_path,
    field_suffixes,
    image_suffix,
    sample_crc,
)
from stoker.formats.wds.tarfmt import (
    BLOCK,
    END_OF_ARCHIVE,
    RECORD,
    padding,
    ustar_header,
    ustar_headers,
)

__all__ = ["KIND", "WdsShardWriter", "open_writer", "shard_path", "write_set_manifest"]

#: the manifest's ``kind`` (the registry name: FORMAT.name)
KIND = "wds"

_KEY_LIMIT = 1 << 63
_ZEROS = bytes(BLOCK)


def shard_path(prefix: str | os.PathLike[str], shard: int | None) -> str:
    """``prefix.tar`` for a single file, ``prefix-00003.tar`` for shard 3."""
    p = os.fspath(prefix)
    return f"{p}.tar" if shard is None else f"{p}-{shard:05d}.tar"


def open_writer(
    prefix: str | os.PathLike[str],
    shard: int | None,
    *,
    schema: Schema | None = None,
    checksums: bool = True,
    overwrite: bool = True,
) -> WdsShardWriter:
    """The writer of shard ``shard`` (``None``: one unsharded file) under ``prefix``. The
    final file is replaced only on ``commit``; pack and convert decide beforehand whether an
    existing set may be replaced, hence ``overwrite=True`` here."""
    return WdsShardWriter(
        shard_path(prefix, shard),
        schema=schema,
        checksums=checksums,
        overwrite=overwrite,
    )


class WdsShardWriter(ShardWriter):
    """One tar shard; see the module docstring. ``checksums=True`` records the sha256 of the
    whole tar in the manifest entry (``stoker verify`` compares it). ``overwrite=False``
    refuses an existing final file; with ``True`` it is replaced on ``commit``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        schema: Schema | None = None,
        checksums: bool = True,
        overwrite: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.schema = schema if schema is not None else Schema.classification()
        head = self._head = self.schema.header_name
        if head is not None and self.schema[head].shape != ():
            raise SpecError(
                f"field {head!r}: WebDataset keeps one integer class per sample in '.cls', "
                f"not shape {self.schema[head].shape}; write this set as recordio or tfrecord"
            )
        self._suffixes = field_suffixes(self.schema)
        self._stored = self.schema.stored
        if not overwrite and os.path.exists(self.path):
            raise OutputExistsError(f"{self.path} exists; pass overwrite=True to replace it")
        self._partial = partial_path(self.path)
        self._hash = hashlib.sha256() if checksums else None
        self._crcs: list[int] | None = [] if checksums else None
        self._keys: list[int] = []
        self._seen: set[int] = set()
        self._max_len: dict[str, int] = {n: 0 for n, f in self._stored.items() if f.variable}
        self._size = 0
        self._done = False
        self._f: IO[bytes] = open(self._partial, "wb")  # noqa: SIM115 - commit/abort close it

    # ------------------------------------------------------------------ writing
    @staticmethod
    def _member(name: bytes, data: bytes) -> list[bytes]:
        return [ustar_header(name, len(data)), data, bytes(padding(len(data)))]

    def _label_text(self, label: Any) -> bytes:
        t = type(label)
        if t is int or (t is float and label.is_integer()):  # the usual labels: no array
            return str(int(label)).encode("ascii")
        arr = np.asarray(label)
        if arr.size != 1 or arr.dtype.kind not in "biuf":
            raise SpecError(f"a WebDataset label is one whole number, got {label!r}")
        value = arr.reshape(()).item()
        if isinstance(value, float) and not value.is_integer():
            raise SpecError(f"a WebDataset label is one whole number, got {value!r}")
        return str(int(value)).encode("ascii")

    def write(
        self,
        key: int,
        image: bytes | memoryview,
        label: Any,
        fields: Mapping[str, Any] | None = None,
    ) -> None:
        """Append sample ``key`` (a distinct int in [0, 2**63)) as one run of members."""
        if self._done:
            raise ValueError(f"{self.path}: the writer is already committed or aborted")
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            raise TypeError(f"a key is an int, got {type(key).__name__}")
        key = int(key)
        if not 0 <= key < _KEY_LIMIT:
            raise ValueError(f"key {key} must be in [0, 2**63)")
        if key in self._seen:
            raise ValueError(f"{self.path}: key {key} is written twice")
        suffix = image_suffix(image)
        if suffix is None:
            raise SpecError(
                f"key {key}: the image bytes are no type a WebDataset reader knows by suffix "
                "(JPEG, PNG, WebP, GIF, BMP, TIFF, PPM, PGM); re-encode them"
            )
        stem = f"{key:09d}".encode("ascii")
        datas = [bytes(image)]
        parts = self._member(stem + b"." + suffix.encode(), datas[0])
        if self._head is not None:
            datas.append(self._label_text(label))
            parts += self._member(stem + b"." + LABEL_SUFFIX.encode(), datas[-1])
        values = fields or {}
        for name, f in self._stored.items():
            if name not in values:
                raise SpecError(f"key {key}: field {name!r} is missing")
            v = f.check(values[name], name=name)
            if f.kind == "text":
                data = v.encode("utf-8")
            elif f.kind in ("bytes", "mask"):
                data = v
            else:
                data = json.dumps(v.tolist(), allow_nan=False).encode("ascii")
            if name in self._max_len:
                self._max_len[name] = max(self._max_len[name], f.length(v))
            datas.append(data)
            parts += self._member(stem + b"." + self._suffixes[name].encode(), data)
        blob = b"".join(parts)
        self._f.write(blob)
        if self._hash is not None:
            self._hash.update(blob)
        if self._crcs is not None:
            self._crcs.append(sample_crc(datas))
        self._size += len(blob)
        self._keys.append(key)
        self._seen.add(key)

    def write_batch(
        self, keys: Sequence[int], images: Sequence[bytes], labels: Sequence[Any]
    ) -> bool:
        """The samples of a set with a ``.cls`` label and no stored fields, JPEG images, int
        labels and new keys, in one go (every member header made as one array, one write:
        the same bytes); ``False`` for any other batch."""
        suffix = common_suffix(images) if self._batchable(keys, labels) else None
        if suffix is None:
            return False
        stems = [b"%09d" % k for k in keys]
        texts = [b"%d" % v for v in labels]
        n = len(stems)
        names: list[bytes] = [b""] * (2 * n)
        dot_image, dot_cls = f".{suffix}".encode(), f".{LABEL_SUFFIX}".encode()
        names[0::2] = [s + dot_image for s in stems]
        names[1::2] = [s + dot_cls for s in stems]
        datas: list[bytes] = [b""] * (2 * n)
        datas[0::2] = images
        datas[1::2] = texts
        sizes = np.fromiter(map(len, datas), np.int64, 2 * n)
        heads = ustar_headers(names, sizes)
        parts: list[Any] = [None] * (6 * n)
        parts[0::3] = [heads[o : o + BLOCK] for o in range(0, 2 * n * BLOCK, BLOCK)]
        parts[1::3] = datas
        parts[2::3] = [_ZEROS[:p] for p in ((-sizes) % BLOCK).tolist()]
        blob = b"".join(parts)
        self._f.write(blob)
        if self._hash is not None:
            self._hash.update(blob)
        if self._crcs is not None:
            self._crcs.extend(map(sample_crc, zip(images, texts, strict=True)))
        self._size += len(blob)
        self._keys.extend(keys)
        self._seen.update(keys)
        return True

    def _batchable(self, keys: Sequence[int], labels: Sequence[Any]) -> bool:
        """Whether :meth:`write_batch` can write these samples in one go: a ``.cls`` label and
        no stored fields, int keys in range and new, int labels."""
        if self._done or self._head is None or self._stored or not len(keys):
            return False
        return all(type(v) is int for v in labels) and self._new_keys(keys, self._seen)

    # ------------------------------------------------------------------ contract
    @property
    def files(self) -> tuple[str, ...]:
        """The final files this shard writes: the tar, and its ``.crc32c`` with checksums (what
        a pack into object storage uploads)."""
        return (self.path,) if self._crcs is None else (self.path, crc_path(self.path))

    @property
    def keys_written(self) -> np.ndarray:
        return np.array(self._keys, dtype=np.int64)

    @property
    def bytes_written(self) -> int:
        return self._size

    @property
    def count(self) -> int:
        return len(self._keys)

    def commit(self) -> dict:
        """End the archive, fsync, rename over ``NAME.tar``; the manifest entry (the tar's
        name relative to its own folder, where the set's manifest goes)."""
        if self._done:
            raise ValueError(f"{self.path}: the writer is already committed or aborted")
        tail = END_OF_ARCHIVE + bytes(-(self._size + len(END_OF_ARCHIVE)) % RECORD)
        self._f.write(tail)
        if self._hash is not None:
            self._hash.update(tail)
        self._size += len(tail)
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        if self._crcs is not None:  # before the tar: a committed tar always has its side-car
            write_bytes_atomic(
                crc_path(self.path), struct.pack(f"<{len(self._crcs)}I", *self._crcs)
            )
        os.replace(self._partial, self.path)
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        self._done = True
        files = {"data": os.path.basename(self.path)}
        if self._crcs is not None:
            files["crc"] = os.path.basename(crc_path(self.path))
        sums = {} if self._hash is None else {"data.sha256": self._hash.hexdigest()}
        return {
            "files": files,
            "records": len(self._keys),
            "bytes": self._size,
            "checksums": sums,
            "max_len": dict(self._max_len),
        }

    def abort(self) -> None:
        """Stop and remove the partial; the final file (if any) is untouched."""
        if self._done:
            return
        self._done = True
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._partial)


def write_set_manifest(
    manifest_path: str | os.PathLike[str], shards: Sequence[Mapping[str, Any]], **fields: Any
) -> None:
    """Write the set's ``NAME.stoker.json`` from its shards' ``commit()`` entries (tar paths
    relative to the manifest's folder, which is the shards' folder; a variable field without
    ``max_len`` gets the largest the shards saw), atomically; ``fields``: ``classes``,
    ``schema``, ``pack``, ``rejects``."""
    write_set(KIND, manifest_path, shards, **fields)
