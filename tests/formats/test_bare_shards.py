"""A shard of a stoker set opened on its own (``Loader("det-00000.tar")``) reads as the set's
manifest declares it: the fields (boxes, classes, caption) and class names the manifest
names, not the bare format's guess, which drops them."""

from __future__ import annotations

import json
import os

import cv2
import numpy as np
import pytest

import stoker
from stoker.formats import open_reader


def _listing(root) -> str:
    os.makedirs(root / "img", exist_ok=True)
    rows = []
    rng = np.random.default_rng(4)
    for i in range(10):
        ok, buf = cv2.imencode(".jpg", rng.integers(0, 255, (40, 48, 3), dtype=np.uint8))
        assert ok
        (root / "img" / f"{i:03d}.jpg").write_bytes(buf.tobytes())
        n = i % 3
        rows.append(
            {
                "image": f"img/{i:03d}.jpg",
                "label": ["cat", "dog"][i % 2],
                "boxes": [[2 + j, 3, 20 + j, 30] for j in range(n)],
                "classes": [j + 1 for j in range(n)],
                "caption": f"picture number {i}",
            }
        )
    path = root / "det.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _samples(reader, fields):
    read = reader.reader(None, fields)
    out = []
    for i in range(len(reader)):
        image, label, _, vals = read(i)
        out.append((bytes(image), int(label), {k: np.asarray(v).tolist() for k, v in vals.items()}))
    return out


@pytest.mark.parametrize(
    ("fmt", "first"), [("wds", "det-00000.tar"), ("tfrecord", "det-00000.tfrecord")]
)
def test_a_bare_shard_keeps_the_fields_its_manifest_declares(tmp_path, fmt, first):
    listing = _listing(tmp_path)
    out = tmp_path / "out" / "det"
    stoker.pack(listing, out, format=fmt, shard_size=6, workers=1, progress=False)
    whole = open_reader(str(out) + ".stoker.json")
    fields = ("boxes", "classes", "caption")
    assert set(fields) <= set(whole.schema.stored)
    bare = open_reader(str(tmp_path / "out" / first))
    assert set(fields) <= set(bare.schema.stored)  # the manifest's fields, not a bare guess
    assert bare.class_names == whole.class_names == ["cat", "dog"]
    assert len(bare) == 6
    assert _samples(bare, fields) == _samples(whole, fields)[:6]
    # and through the loader, with its fields in the batch
    with stoker.Loader(str(tmp_path / "out" / first), batch_size=6, workers=0) as ld:
        batch = next(iter(ld))
    assert "caption" in batch.schema and "boxes" in batch.schema


def test_a_tar_without_its_manifest_names_the_members_it_leaves_out(tmp_path):
    listing = _listing(tmp_path)
    out = tmp_path / "out" / "det"
    stoker.pack(listing, out, format="wds", shard_size=6, workers=1, progress=False)
    alone = tmp_path / "alone"
    alone.mkdir()
    os.rename(tmp_path / "out" / "det-00000.tar", alone / "det-00000.tar")
    bare = open_reader(str(alone / "det-00000.tar"))
    with pytest.warns(UserWarning, match=r"\.boxes\.json, \.caption, \.classes\.json are not read"):
        assert list(bare.schema) == ["image", "label"]
