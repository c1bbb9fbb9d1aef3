"""``ShardWriter.write_many``: many samples in one call give the bytes of one ``write`` each.

RecordIO frames a batch of one-number labels in one go (one join, one write per file, the
checksums and ``.idx`` lines of the whole batch at once) and falls back to a record at a time
for what that cannot hold: a payload with the magic at an aligned offset (a split record),
keys that do not increase, label vectors, a sample that cannot be stored. Every case must
give the same ``.rec``, ``.idx``, ``.crc32c`` and manifest entry as ``write`` one by one.
"""

from __future__ import annotations

import io
import json
import os
import struct

import numpy as np
import pytest
from PIL import Image

from stoker._core.schema import Schema
from stoker.formats.registry import get

MAGIC = struct.pack("<I", 0xCED7230A)


def jpeg(seed: int, size: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size + 3, 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=80
    )
    return buf.getvalue()


def samples(
    n: int, seed: int = 0, *, fractions: bool = True
) -> tuple[list[int], list[bytes], list]:
    """``n`` samples of a few sizes (lengths of every remainder mod 4), int labels and
    (``fractions``) fractional ones; image 3 holds the magic at an aligned offset of its
    RecordIO payload (after the 24-byte header), image 5 is a JPEG with a broken header."""
    rng = np.random.default_rng(seed)
    images = [jpeg(seed * 1000 + i, 8 + i % 7) + b"\0" * (i % 4) for i in range(n)]
    if n > 3:
        images[3] = images[3] + b"\0" * (-len(images[3]) % 4) + MAGIC + b"tail"
    if n > 5:  # a JPEG's first bytes and no readable header: TFRecord leaves out its size
        images[5] = b"\xff\xd8\xff" + bytes(range(40))
    labels: list = [int(x) for x in rng.integers(0, 10, n)]
    if fractions:
        labels[1::5] = [float(x) + 0.25 for x in labels[1::5]]
    keys = [int(k) for k in np.cumsum(rng.integers(1, 5, n))]
    return keys, images, labels


def files(prefix: str) -> dict[str, bytes]:
    folder, base = os.path.split(prefix)
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith(base):
            with open(os.path.join(folder, name), "rb") as f:
                out[name[len(base) :]] = f.read()
    return out


def one_by_one(fmt: str, prefix: str, keys, images, labels) -> tuple[dict, list, dict]:
    w = get(fmt).load("writer")(prefix, None, schema=Schema.classification(), checksums=True)
    errors = []
    for j, (k, image, label) in enumerate(zip(keys, images, labels, strict=True)):
        try:
            w.write(k, image, label, {})
        except ValueError as e:
            errors.append((j, str(e)))
    entry = w.commit()
    return files(prefix), errors, entry


def batched(fmt: str, prefix: str, keys, images, labels, sizes) -> tuple[dict, list, dict]:
    w = get(fmt).load("writer")(prefix, None, schema=Schema.classification(), checksums=True)
    errors, a = [], 0
    for size in sizes:
        b = min(len(keys), a + size)
        got = w.write_many(keys[a:b], images[a:b], labels[a:b], [{}] * (b - a))
        errors += [(a + j, why) for j, why in got]
        a = b
    assert a == len(keys)
    entry = w.commit()
    return files(prefix), errors, entry


def _same(tmp_path, fmt, keys, images, labels, sizes) -> list:
    want = one_by_one(fmt, str(tmp_path / "a" / "set"), keys, images, labels)
    got = batched(fmt, str(tmp_path / "b" / "set"), keys, images, labels, sizes)
    assert got[0] == want[0]  # every file, byte for byte
    where = [(j, why.replace(str(tmp_path / "b"), str(tmp_path / "a"))) for j, why in got[1]]
    assert where == want[1]
    entry = json.dumps(got[2], sort_keys=True).replace(str(tmp_path / "b"), str(tmp_path / "a"))
    assert entry == json.dumps(want[2], sort_keys=True)  # the manifest entry, paths aside
    return got[1]


@pytest.mark.parametrize("fmt", ["recordio", "tfrecord", "wds"])
def test_batches_give_the_bytes_of_one_write_each(tmp_path, fmt):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    keys, images, labels = samples(150, fractions=fmt == "recordio")
    assert _same(tmp_path, fmt, keys, images, labels, [1, 2, 64, 3, 100]) == []


@pytest.mark.parametrize("fmt", ["tfrecord", "wds"])
def test_a_batch_with_a_sample_the_format_refuses(tmp_path, fmt):
    """A fractional label (refused in a classification set) and a PNG among JPEGs: the
    other samples of the batch are written as one write each writes them."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    keys, images, labels = samples(40, fractions=False)
    labels[7] = 2.5
    buf = io.BytesIO()
    Image.new("RGB", (5, 4)).save(buf, "PNG")
    images[30] = buf.getvalue()
    errors = _same(tmp_path, fmt, keys, images, labels, [20, 20])
    assert [j for j, _ in errors] == [7]


@pytest.mark.parametrize(
    "case", ["magic_key", "keys_down", "duplicate", "vector", "key_past_int64", "big_label"]
)
def test_recordio_batches_that_need_one_record_at_a_time(tmp_path, case):
    """Each batch the one-go framing cannot hold still gives write's bytes and errors, and
    the batches around it are framed in one go."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    keys, images, labels = samples(40, seed=1)
    images[3] = images[4]  # no split record: only the case at hand falls back
    if case == "magic_key":  # the IRHeader's id holds the magic: dmlc splits the record
        keys[20:] = [0xCED7230A + j for j in range(20)]
    elif case == "keys_down":
        keys[20:30] = keys[20:30][::-1]
    elif case == "duplicate":
        keys[25] = keys[24]
    elif case == "vector":
        labels[22] = np.array([1.0, 2.5], np.float32)
    elif case == "key_past_int64":
        keys[39] = 1 << 64
    elif case == "big_label":  # float32 holds it only as the nearest value below inf
        labels[21] = 3.4e38
    errors = _same(tmp_path, "recordio", keys, images, labels, [20, 20])
    assert [j for j, _ in errors] == {"duplicate": [25], "key_past_int64": [39]}.get(case, [])
