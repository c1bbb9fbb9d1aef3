"""Builders shared by the WebDataset tests: tar headers made by hand from the POSIX spec (not
with stoker's code), tiny real images, and shards written by the ``webdataset`` package."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def octal(value: int, width: int) -> bytes:
    """A ustar number field: ``width - 1`` octal digits and a NUL."""
    return f"{value:0{width - 1}o}".encode() + b"\x00"


def hand_header(
    name: bytes,
    size: int,
    *,
    typeflag: bytes = b"0",
    mode: int = 0o644,
    mtime: int = 0,
    linkname: bytes = b"",
    size_field: bytes | None = None,
) -> bytes:
    """A 512-byte ustar header laid out field by field from the POSIX spec; its checksum is
    the sum of all 512 bytes with the checksum field taken as 8 spaces, written as six octal
    digits, a NUL and a space."""
    h = bytearray(512)
    h[0:100] = name.ljust(100, b"\x00")
    h[100:108] = octal(mode, 8)
    h[108:116] = octal(0, 8)  # uid
    h[116:124] = octal(0, 8)  # gid
    h[124:136] = size_field if size_field is not None else octal(size, 12)
    h[136:148] = octal(mtime, 12)
    h[148:156] = b" " * 8
    h[156:157] = typeflag
    h[157:257] = linkname.ljust(100, b"\x00")
    h[257:263] = b"ustar\x00"
    h[263:265] = b"00"
    h[329:337] = octal(0, 8)
    h[337:345] = octal(0, 8)
    total = sum(h)
    h[148:156] = f"{total:06o}".encode() + b"\x00 "
    return bytes(h)


def hand_member(name: bytes, data: bytes, **kw: object) -> bytes:
    return hand_header(name, len(data), **kw) + data + bytes(-len(data) % 512)  # type: ignore[arg-type]


def end_of_archive() -> bytes:
    return bytes(1024)


def jpeg(i: int, size: int = 8) -> bytes:
    """A small real JPEG, different for each ``i``."""
    rng = np.random.default_rng(i)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def png(i: int, size: int = 8) -> bytes:
    rng = np.random.default_rng(1000 + i)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def samples(n: int) -> list[dict]:
    """``n`` samples as the ``webdataset`` writers take them: key, image, class, caption."""
    return [
        {
            "__key__": f"sample{i:05d}",
            "jpg" if i % 3 else "png": jpeg(i) if i % 3 else png(i),
            "cls": i % 4,
            "txt": f"a caption number {i} \u00e9" * (1 + i % 2),
        }
        for i in range(n)
    ]


def image_of(sample: dict) -> bytes:
    return sample["jpg"] if "jpg" in sample else sample["png"]
