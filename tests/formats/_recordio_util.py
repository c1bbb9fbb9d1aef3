"""Small builders shared by the RecordIO tests: tiny real files in tmp_path."""

from __future__ import annotations

import os
import random
import struct

from stoker.formats.recordio import IRHeader, RecordWriter, pack_header

MAGIC_LE = struct.pack("<I", 0xCED7230A)


def payload(i: int, *, size: int | None = None, labels: int = 0) -> bytes:
    """A deterministic dmlc payload: IRHeader (label i or ``labels`` labels) + pseudo-image."""
    rng = random.Random(i)
    n = size if size is not None else rng.randrange(0, 200)
    body = bytes(rng.getrandbits(8) for _ in range(n))
    label = float(i % 7) if labels == 0 else [float(i + j) for j in range(labels)]
    return pack_header(IRHeader(0, label, i, 0), body)


def write_rec(
    directory: str | os.PathLike[str],
    payloads: list[bytes],
    *,
    name: str = "data",
    keys: list[int] | None = None,
    checksums: bool = True,
) -> str:
    rec = os.path.join(os.fspath(directory), name + ".rec")
    with RecordWriter(rec, checksums=checksums) as w:
        for j, p in enumerate(payloads):
            w.write(keys[j] if keys is not None else j, p)
    return rec


def naive_frame(data: bytes) -> bytes:
    """dmlc's split rule written the most literal way, byte by byte (independent of stoker)."""
    out = b""
    start = 0
    first = True
    i = 0
    while i + 4 <= (len(data) // 4) * 4:
        if data[i : i + 4] == MAGIC_LE:
            cflag = 1 if first else 2
            out += MAGIC_LE + struct.pack("<I", (cflag << 29) | (i - start)) + data[start:i]
            start = i + 4
            first = False
        i += 4
    cflag = 0 if first else 3
    out += MAGIC_LE + struct.pack("<I", (cflag << 29) | (len(data) - start)) + data[start:]
    out += b"\x00" * ((4 - len(data) % 4) % 4)
    return out
