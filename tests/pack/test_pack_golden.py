"""Golden outputs: a fixed small folder, listing and convert source packed in every format,
sharded, with a reject, a re-encoded PNG and a shuffled order, give exactly the bytes
recorded here (sha256 of every file: shards, indexes, ``.crc32c`` side-cars, rejects and
``.lst``; the manifest by what it means once loaded, see ``packhelp.manifest_meaning``, so
the version-1 manifests the recorded release wrote and the version-2 ones written now
compare equal), whatever the worker count, and the plan / shard-job / finalize steps run in
a shuffled shard order give the same. Changing how a set is written changes these digests:
that is a format change, and must be meant."""

from __future__ import annotations

import hashlib
import json
import os
import random

import pytest
from packhelp import data_and_meaning as digests
from packhelp import image_bytes, write

import stoker
from stoker.pack.steps import finalize_pack, pack_shards, plan_pack

FORMATS = ("recordio", "tfrecord", "wds")
OPTS = {"shard_size": 5, "shuffle": True, "seed": 7, "progress": False}


def make_inputs(root: str) -> dict[str, str]:
    """The inputs, the same bytes on every run: an image folder of two classes (13 JPEGs
    of a few sizes, one PNG that is re-encoded, one empty file that is rejected) and a
    ``.jsonl`` listing with a number, boxes and a caption."""
    folder = os.path.join(root, "folder")
    for c, n in (("cat", 8), ("dog", 5)):
        for i in range(n):
            size = (32 + 4 * (i % 3), 28 + 2 * (i % 4))
            write(os.path.join(folder, c, f"{i:02d}.jpg"), image_bytes(size, seed=17 * i + n))
    write(os.path.join(folder, "dog", "png.png"), image_bytes((20, 24), fmt="PNG", seed=3))
    write(os.path.join(folder, "cat", "empty.jpg"), b"")
    rows = []
    for i in range(9):
        write(os.path.join(root, "img", f"{i}.jpg"), image_bytes((40, 30 + i), seed=100 + i))
        boxes = [[1.0 + j, 2.0, 20.0 + j, 25.0] for j in range(i % 3)]
        rows.append(
            {"image": f"img/{i}.jpg", "label": i % 3, "boxes": boxes, "text": "w" * (2 * i)}
        )
    rows.append({"image": "img/missing.jpg", "label": 0, "boxes": [], "text": ""})
    listing = os.path.join(root, "rows.jsonl")
    write(listing, "".join(json.dumps(r) + "\n" for r in rows).encode())
    return {"folder": folder, "listing": listing}


def _digest(prefix: str) -> str:
    """One digest of every file of the set under ``prefix``, name and bytes (the manifest:
    name and meaning)."""
    h = hashlib.sha256()
    for name, d in digests(prefix).items():
        h.update(f"{name}\t{d}\n".encode())
    return h.hexdigest()[:16]


#: (input, format) -> digest of the whole set, from the code before the pack path was unified
#: (the manifests' meaning: the version-1 manifests that code wrote, loaded)
GOLDEN = {
    ("folder", "recordio"): "13055e5b0b0f7cbc",
    ("folder", "tfrecord"): "1896ad2d5fb63007",
    ("folder", "wds"): "e3f8ae8f4a0800d8",
    ("listing", "recordio"): "32f4b7a242836de1",
    ("listing", "tfrecord"): "09d0927ed3457d7f",
    ("listing", "wds"): "e0a2eb71e247deda",
    ("convert", "recordio"): "1ac16536f081f580",
    ("convert", "tfrecord"): "05be7501c0bdc3e0",
    ("convert", "wds"): "f40e79b3f67337ff",
    ("convert_recordio", "recordio"): "1835e9697b1aa29a",
    ("convert_recordio", "tfrecord"): "e6bf0d132934ecea",
    ("convert_recordio", "wds"): "f62f49bc52369526",
    ("convert_wds", "recordio"): "7fe6f44c4775751f",
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    root = str(tmp_path_factory.mktemp("golden"))
    got = make_inputs(root)
    src = os.path.join(root, "source", "set")  # what the converts read: a TFRecord set
    stoker.pack(got["folder"], src, workers=1, format="tfrecord", shard_size=4, progress=False)
    got["convert"] = src + ".stoker.json"
    for fmt in ("recordio", "wds"):  # the other sources a convert reads
        src = os.path.join(root, f"source_{fmt}", "set")
        stoker.pack(got["folder"], src, workers=1, format=fmt, shard_size=4, progress=False)
        got[f"convert_{fmt}"] = src + ".stoker.json"
    return got


def _run(kind: str, src: str, out: str, fmt: str, workers: int) -> None:
    if kind.startswith("convert"):
        stoker.convert(src, out, format=fmt, workers=workers, **OPTS)
    else:
        stoker.pack(src, out, format=fmt, workers=workers, list_file=True, **OPTS)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["folder", "listing", "convert"])
def test_a_local_run_gives_the_golden_bytes(inputs, tmp_path, kind, fmt):
    out = str(tmp_path / "set")
    _run(kind, inputs[kind], out, fmt, 2)
    assert _digest(out) == GOLDEN[kind, fmt], (kind, fmt, digests(out))


@pytest.mark.parametrize(
    ("kind", "fmt"),
    [("convert_recordio", "recordio"), ("convert_recordio", "tfrecord"),
     ("convert_recordio", "wds"), ("convert_wds", "recordio")],
)  # fmt: skip
def test_a_convert_from_each_format_gives_the_golden_bytes(inputs, tmp_path, kind, fmt):
    """Each source format's reader into each writer (RecordIO's records framed many at a
    time) gives the bytes the record-at-a-time writers gave."""
    out = str(tmp_path / "set")
    _run(kind, inputs[kind], out, fmt, 2)
    assert _digest(out) == GOLDEN[kind, fmt], (kind, fmt, _digest(out), digests(out))


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 3, 4])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["folder", "listing", "convert"])
def test_any_worker_count_gives_the_golden_bytes(inputs, tmp_path, kind, fmt, workers):
    out = str(tmp_path / "set")
    _run(kind, inputs[kind], out, fmt, workers)
    assert _digest(out) == GOLDEN[kind, fmt], (kind, fmt, workers, digests(out))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["folder", "convert"])
def test_steps_in_a_shuffled_order_give_the_golden_bytes(inputs, tmp_path, kind, fmt):
    out = str(tmp_path / "set")
    opts = {k: v for k, v in OPTS.items() if k != "progress"}
    if kind == "convert":
        plan = plan_pack(inputs[kind], out, convert=True, format=fmt, **opts)
    else:
        plan = plan_pack(inputs[kind], out, format=fmt, list_file=True, **opts)
    with open(plan, encoding="utf-8") as f:
        n = len(json.load(f)["shards"])
    order = list(range(n))
    random.Random(fmt).shuffle(order)
    for s in order:
        pack_shards(plan, str(s), workers=1, progress=False)
    finalize_pack(plan, progress=False)
    os.unlink(plan)
    assert _digest(out) == GOLDEN[kind, fmt], (kind, fmt, digests(out))
