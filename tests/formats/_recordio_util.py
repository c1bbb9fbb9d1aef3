"""Small builders shared by the RecordIO tests: tiny real files in tmp_path."""

from __future__ import annotations

import os
import random
import struct

from stoker.formats.recordio import (
    IRHeader,
    RecordWriter,
    make_manifest,
    pack_header,
    shard_entry,
    unpack_header,
    write_manifest,
)

MAGIC_LE = struct.pack("<I", 0xCED7230A)
SPECIAL_WORDS = [
    MAGIC_LE,
    struct.pack("<I", 0x1FFFFFFF),
    struct.pack("<I", 0x20000000),
    struct.pack("<I", 0x40000004),
    struct.pack("<I", 0x60000000),
    struct.pack("<I", 2**31),
    b"\xff\xff\xff\xff",
    b"\x00\x00\x00\x00",
]


def payload(i: int, *, size: int | None = None, labels: int = 0) -> bytes:
    """A deterministic dmlc payload: IRHeader (label ``i % 3``, one of the three classes :func:`write_shards` names, or ``labels`` labels) + pseudo-image."""
    rng = random.Random(i)
    n = size if size is not None else rng.randrange(0, 200)
    body = bytes(rng.getrandbits(8) for _ in range(n))
    label = float(i % 3) if labels == 0 else [float(i + j) for j in range(labels)]
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


def mutate(data: bytes, rng: random.Random, *, text: bool) -> bytes:
    """``data`` with one seeded random damage: flipped bits, a cut, an inserted or deleted
    byte, or (not ``text``) a word that means something to the framing."""
    b = bytearray(data)
    kind = rng.randrange(7)
    if not b:
        return bytes([rng.getrandbits(8)])
    pos = rng.randrange(len(b))
    if kind == 0:
        b[pos] ^= 1 << rng.randrange(8)
    elif kind == 1:
        b[pos] = rng.choice(b"0123456789\t\n\r -x") if text else rng.getrandbits(8)
    elif kind == 2:
        del b[pos:]
    elif kind == 3:
        b.insert(pos, rng.choice(b"0123456789\t\n") if text else rng.getrandbits(8))
    elif kind == 4:
        del b[pos]
    elif kind == 5 and not text:
        p = pos & ~3
        b[p : p + 4] = rng.choice(SPECIAL_WORDS)
    else:
        for _ in range(rng.randrange(2, 6)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def face_set(path, per_identity=(3, 1, 4), *, header_last=True, breaker=None):
    """Write a set the way insightface's face2rec does (header record 0 written last)."""
    images = []
    for ident, n in enumerate(per_identity):
        images += [ident] * n
    a = 1 + len(images)  # first identity key
    b = a + len(per_identity)
    recs = {}
    for k, ident in enumerate(images, start=1):
        recs[k] = pack_header(IRHeader(0, float(ident), k, 0), b"\xff\xd8jpeg%d" % k)
    start = 1
    for j, n in enumerate(per_identity):
        recs[a + j] = pack_header(IRHeader(0, [start, start + n], 0, 0), b"")
        start += n
    recs[0] = pack_header(IRHeader(0, [a, b], 0, 0), b"")
    if breaker:
        breaker(recs, a, b)
    order = sorted(recs, key=lambda k: (k == 0) if header_last else k)
    with RecordWriter(path) as w:
        for k in order:
            w.write(k, recs[k])
    return a, b


def write_shards(tmp_path, sizes, *, name="train", same_keys=True):
    """Shards of ``sizes`` records and their ``NAME.stoker.json`` (three classes, pack and
    reject notes); returns the manifest's path and every payload in position order."""
    infos, allp = [], []
    start = 0
    for j, n in enumerate(sizes):
        ps = [payload(start + i) for i in range(n)]
        w = RecordWriter(tmp_path / f"{name}-{j:05d}.rec", checksums=True)
        for i, p in enumerate(ps):
            w.write(i if same_keys else start + i, p)
        infos.append(w.commit())
        allp += ps
        start += n
    mpath = tmp_path / f"{name}.stoker.json"
    m = make_manifest(
        [shard_entry(info, mpath) for info in infos],
        classes={"cat": 0, "dog": 1, "emu": 2},
        pack={"workers": 2, "resize": None},
        rejects={"count": 1, "by_reason": {"truncated": 1}},
    )
    write_manifest(mpath, m)
    return mpath, allp


def image(p: bytes) -> bytes:
    """The image bytes of dmlc payload ``p`` (after its IRHeader and labels)."""
    return bytes(unpack_header(p)[1])


def header_of(r, i: int):
    """The IRHeader of sample ``i`` of RecordIO reader ``r``, read from its shard's file."""
    j, row = r.where(i)
    sh = r.shard(j)
    return sh._file().read_header(sh._at(row))[0]
