"""The whole way: a JSONL listing with every kind of field, ``stoker.pack``, then
``stoker.Loader``: every field arrives as the listing gave it (workers 0 and 2, and after a
mid-epoch resume), and a mirror moves the boxes, keypoints and mask with the image."""

from __future__ import annotations

import io
import json

import cv2
import numpy as np
import pytest
from PIL import Image

import stoker
from stoker.transforms import Compose, HorizontalFlip, Resize

N, H, W = 11, 32, 40


def _png_mask(i: int) -> tuple[bytes, np.ndarray]:
    m = np.zeros((H, W), np.uint8)
    m[4 + i % 5 : 20, 6 : 30 - i % 7] = 1 + i % 3
    im = Image.fromarray(m, "P")
    im.putpalette([(60 * k) % 256 for k in range(768)])
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue(), m


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("listing")
    (root / "img").mkdir()
    (root / "seg").mkdir()
    rng = np.random.default_rng(0)
    rows, masks = [], []
    for i in range(N):
        img = rng.integers(0, 255, (H, W, 3), dtype=np.uint8)
        ok, jpg = cv2.imencode(".jpg", img)
        assert ok
        (root / "img" / f"{i}.jpg").write_bytes(jpg.tobytes())
        png, m = _png_mask(i)
        (root / "seg" / f"{i}.png").write_bytes(png)
        masks.append(m)
        k = i % 4  # 0..3 objects, an image without any among them
        rows.append(
            {
                "image": f"img/{i}.jpg",
                "label": i % 3,
                "boxes": [[2.0 + j, 3.5, 12.25 + 3 * j, 20.0 + j] for j in range(k)],
                "classes": [(i + j) % 5 for j in range(k)],
                "keypoints": [[[5.5 + j, 6.0, 1.0], [7.0, 9.5 + j, 1.0]] for j in range(k)],
                "text": "ünïcode line " * (i % 3) + str(i),
                "seg_mask": f"seg/{i}.png",
                "attrs": [i * 0.25, -1.0, 3.0],
            }
        )
    listing = root / "train.jsonl"
    listing.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    out = root / "train"
    stoker.pack(str(listing), str(out), workers=1, progress=False)
    return f"{out}.stoker.json", rows, masks


def _collect(loader) -> list[dict]:
    got = []
    for b in loader:
        got.append(
            {
                "images": b.images.copy(),
                "indices": b.indices.copy(),
                "labels": b.labels.copy(),
                **{n: [np.array(x) for x in b[n]] for n in ("boxes", "classes", "keypoints")},
                "text": list(b["text"]),
                "seg_mask": b["seg_mask"].copy(),
                "attrs": b["attrs"].copy(),
                "size": b["size"].copy() if "size" in b else None,
            }
        )
    return got


def _check_against_listing(batches: list[dict], rows: list[dict], masks: list[np.ndarray]):
    seen = []
    for b in batches:
        for r, i in enumerate(b["indices"].tolist()):
            row = rows[i]
            seen.append(i)
            assert b["labels"][r] == row["label"]
            for name in ("boxes", "classes", "keypoints"):
                want = np.asarray(row[name]).reshape(b[name][r].shape) if row[name] else None
                if want is None:
                    assert len(b[name][r]) == 0
                else:
                    np.testing.assert_array_equal(b[name][r], want)
            assert b["text"][r] == row["text"]
            np.testing.assert_array_equal(b["seg_mask"][r], masks[i])
            np.testing.assert_array_equal(b["attrs"][r], np.float32(row["attrs"]))
            assert tuple(b["size"][r]) == (H, W)
    assert sorted(seen) == list(range(len(rows)))


@pytest.mark.parametrize("workers", [0, 2])
def test_every_field_kind_arrives_as_listed(packed, workers):
    manifest, rows, masks = packed
    kw = dict(batch_size=4, shuffle=True, seed=3, transforms=Resize((H, W)), workers=workers)
    with stoker.Loader(manifest, fields=None, **kw) as ld:
        assert set(ld.schema) >= {"boxes", "classes", "keypoints", "text", "seg_mask", "attrs"}
        first = _collect(ld)
    with stoker.Loader(manifest, fields=[*ld.schema.extra, "size"], **kw) as ld:
        got = _collect(ld)
    _check_against_listing(got, rows, masks)
    for a, b in zip(first, got):
        np.testing.assert_array_equal(a["images"], b["images"])


def test_a_resume_mid_epoch_gives_the_same_fields(packed):
    manifest, rows, masks = packed
    kw = dict(batch_size=3, shuffle=True, seed=5, transforms=Resize((H, W)), workers=2)
    kw["fields"] = ["boxes", "classes", "keypoints", "text", "seg_mask", "attrs", "size"]
    with stoker.Loader(manifest, **kw) as ld:
        full = _collect(ld)
    with stoker.Loader(manifest, **kw) as ld:
        it = iter(ld)
        next(it)
        next(it)
        state = ld.state_dict()
    with stoker.Loader(manifest, **kw) as ld:
        ld.load_state_dict(state)
        rest = _collect(ld)
    assert len(rest) == len(full) - 2
    for a, b in zip(full[2:], rest):
        for k in a:
            if isinstance(a[k], list):
                assert len(a[k]) == len(b[k])
                for x, y in zip(a[k], b[k]):
                    np.testing.assert_array_equal(x, y)
            else:
                np.testing.assert_array_equal(a[k], b[k])
    _check_against_listing(full, rows, masks)


def test_a_mirror_moves_boxes_points_and_mask_with_the_image(packed):
    manifest, rows, masks = packed
    chain = Compose([Resize((H, W)), HorizontalFlip(p=1.0)])
    kw = dict(batch_size=4, seed=0, workers=0, transforms=chain)
    kw["fields"] = ["boxes", "classes", "keypoints", "seg_mask"]
    with stoker.Loader(manifest, **kw) as ld:
        for b in ld:
            for r, i in enumerate(b.indices.tolist()):
                row = rows[i]
                np.testing.assert_array_equal(b["seg_mask"][r], masks[i][:, ::-1])
                if not row["boxes"]:
                    assert len(b["boxes"][r]) == 0
                    continue
                want = np.asarray(row["boxes"], np.float32)
                want = np.stack([W - want[:, 2], want[:, 1], W - want[:, 0], want[:, 3]], 1)
                np.testing.assert_allclose(b["boxes"][r], want, atol=1e-4)
                np.testing.assert_array_equal(b["classes"][r], row["classes"])
                kp = np.asarray(row["keypoints"], np.float32)
                kp[..., 0] = W - kp[..., 0]
                np.testing.assert_allclose(b["keypoints"][r], kp, atol=1e-4)
