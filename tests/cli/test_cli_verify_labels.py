"""`stoker verify` of a RecordIO set whose IRHeader labels are wrong under valid CRCs: a NaN or
infinite label is listed with its key and byte offset (exit 1); in a set whose manifest names
classes, so is a one-label record whose label is not one of their ids (2.5, 1e30, -1, 3)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from _cli_util import verify_json
from PIL import Image

from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.formats.recordio.manifest import make_manifest, shard_entry, write_manifest

LABELS = [0.0, 1.0, float("nan"), 2.0, float("inf"), 1.0, 0.0, 2.0]
BAD = (2, 4)


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _write(rec: str, labels: list[float]) -> tuple[list[int], Any]:
    """A ``.rec`` (with ``.idx`` and ``.crc32c``) of one real JPEG per label; the offsets and
    the committed shard's info."""
    w = RecordWriter(rec, checksums=True)
    for k, lab in enumerate(labels):
        w.write(k, pack_header(IRHeader(0, lab, k, 0), _jpeg(k)))
    info = w.commit()
    with open(rec[:-4] + ".idx") as f:
        return [int(line.split("\t")[1]) for line in f], info


def test_verify_lists_each_non_finite_label_with_key_and_offset(tmp_path):
    rec = str(tmp_path / "d.rec")
    offsets, _ = _write(rec, LABELS)
    rc, rep = verify_json(rec)
    assert rc == 1
    got = [(p["key"], p["offset"]) for p in rep["problems"]]
    assert got == [(k, offsets[k]) for k in BAD]
    assert all("is not a finite number" in p["reason"] for p in rep["problems"])
    assert rep["checksummed"] == len(LABELS)  # the CRCs are right: only the labels are wrong


def test_verify_lists_labels_that_are_not_the_manifests_class_ids(tmp_path):
    mpath = str(tmp_path / "s.stoker.json")
    rec = str(tmp_path / "s.rec")
    labels = [0.0, 2.5, 1.0, 1e30, 2.0, -1.0, 3.0]
    offsets, info = _write(rec, labels)
    entry = shard_entry(info, mpath)
    write_manifest(mpath, make_manifest([entry], classes={"a": 0, "b": 1, "c": 2}))
    rc, rep = verify_json(mpath)
    assert rc == 1
    assert [(p["key"], p["offset"]) for p in rep["problems"]] == [
        (k, offsets[k]) for k in (1, 3, 5, 6)
    ]
    assert all("is not a class id (the manifest names 3" in p["reason"] for p in rep["problems"])
