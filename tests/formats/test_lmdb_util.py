"""Builders shared by the LMDB tests: real databases written with the ``lmdb`` package, Caffe
``Datum`` values assembled from the wire format (there is no Caffe here), images from cv2."""

from __future__ import annotations

import os

import cv2
import lmdb
import numpy as np

from stoker.formats.protowire import LEN, VARINT, encode_field


def datum(
    *,
    channels: int | None = None,
    height: int | None = None,
    width: int | None = None,
    data: bytes | None = None,
    label: int | None = None,
    encoded: bool | None = None,
    float_data: list[float] | None = None,
) -> bytes:
    """A Datum's wire bytes, fields in caffe.proto order (as protobuf serialises them)."""
    out = b""
    for number, v in ((1, channels), (2, height), (3, width)):
        if v is not None:
            out += encode_field(number, VARINT, v)
    if data is not None:
        out += encode_field(4, LEN, data)
    if label is not None:
        out += encode_field(5, VARINT, label)
    if float_data is not None:
        packed = np.asarray(float_data, dtype="<f4").tobytes()
        out += encode_field(6, LEN, packed)
    if encoded is not None:
        out += encode_field(7, VARINT, int(encoded))
    return out


def raw_datum(bgr: np.ndarray, label: int) -> bytes:
    """A raw Datum of an HWC BGR (or HW grey) image, stored CHW as Caffe's convert_imageset does."""
    hwc = bgr if bgr.ndim == 3 else bgr[:, :, None]
    h, w, c = hwc.shape
    chw = np.ascontiguousarray(hwc.transpose(2, 0, 1)).tobytes()
    return datum(channels=c, height=h, width=w, data=chw, label=label)


def photo(seed: int, h: int = 24, w: int = 32) -> np.ndarray:
    """A small BGR image with structure and noise (so encoders have something to keep)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[:h, :w]
    base = np.stack([(x * 7 + seed) % 256, (y * 5) % 256, ((x + y) * 3) % 256], -1)
    noisy = base + rng.integers(-20, 20, base.shape)
    return noisy.clip(0, 255).astype(np.uint8)


def encode(bgr: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, bgr)
    assert ok
    return buf.tobytes()


def write_db(
    path: str | os.PathLike[str], items: list[tuple[bytes, bytes]], *, subdir: bool = True
) -> str:
    """Write ``items`` (key, value) with the real lmdb package; returns the path."""
    p = os.fspath(path)
    env = lmdb.open(p, map_size=1 << 26, subdir=subdir)
    try:
        with env.begin(write=True) as txn:
            for k, v in items:
                assert txn.put(k, v)
    finally:
        env.close()
    return p


def lsun_key(i: int) -> bytes:
    """An LSUN-style key: 40 hex digits (LSUN keys are sha1 hex strings)."""
    return f"{i * 2654435761 % (1 << 160):040x}".encode()
