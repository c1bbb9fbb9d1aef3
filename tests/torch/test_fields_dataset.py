"""RecordDataset on a set packed with fields: dict samples equal to the loader's rows (boxes,
masks and the rest moved by the same draws), batched by collate_fields in a torch DataLoader
with worker processes; a set without fields, or fields=[], keeps (image, label)."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import stoker
import stoker.torch as st
from stoker._core.errors import SpecError
from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize

pytestmark = pytest.mark.timeout(120)

COLOUR = 230


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    """24 JPEGs with 0-3 bright rectangles, their boxes, classes, a mask PNG, a caption and a
    score vector, packed from a JSONL listing."""
    root = tmp_path_factory.mktemp("fields")
    (root / "img").mkdir()
    rng = np.random.default_rng(0)
    rows = []
    for i in range(24):
        img = rng.integers(0, 60, size=(48, 56, 3), dtype=np.uint8)
        mask = np.zeros((48, 56), np.uint8)
        boxes, classes = [], []
        for j in range(i % 4):
            y0, x0 = 2 + 15 * j, int(rng.integers(0, 30))
            img[y0 : y0 + 10, x0 : x0 + 20] = COLOUR
            mask[y0 : y0 + 10, x0 : x0 + 20] = j + 1
            boxes.append([x0, y0, x0 + 20, y0 + 10])
            classes.append(j + 1)
        cv2.imwrite(str(root / "img" / f"{i}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        cv2.imwrite(str(root / "img" / f"{i}_mask.png"), mask)
        rows.append(
            {
                "image": f"img/{i}.jpg",
                "label": i % 3,
                "boxes": boxes,
                "classes": classes,
                "mask": f"img/{i}_mask.png",
                "caption": f"{len(boxes)} bars ü{i}",
                "score": [float(i), 0.5],
            }
        )
    listing = root / "listing.jsonl"
    listing.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return stoker.pack(listing, root / "train", workers=1, progress=False).manifest


def _transforms():
    return Compose([Resize(40), RandomCrop(32), HorizontalFlip()])


def test_samples_are_dicts_equal_to_the_loader_rows(manifest):
    ds = st.RecordDataset(manifest, transforms=_transforms(), seed=5, epoch=0)
    assert ds.has_fields
    with stoker.Loader(
        manifest, batch_size=8, transforms=_transforms(), seed=5, workers=0, fields=None
    ) as loader:
        batches = list(loader)
    rows = [(b, r) for b in batches for r in range(len(b))]
    assert len(rows) == len(ds) == 24
    for b, r in rows:
        s = ds[int(b.indices[r])]
        assert set(s) == {"image", "label", "boxes", "classes", "mask", "caption", "score"}
        assert torch.equal(s["image"], torch.from_numpy(b.images[r]))
        assert s["label"] == int(b.labels[r])
        assert torch.equal(s["boxes"], torch.from_numpy(b["boxes"][r]))
        assert torch.equal(s["classes"], torch.from_numpy(b["classes"][r]))
        assert torch.equal(s["mask"], torch.from_numpy(b["mask"][r]))
        assert torch.equal(s["score"], torch.from_numpy(b["score"][r]))
        assert s["caption"] == b["caption"][r]
    # the boxes still cover their bars: the image under each box centre is bright
    s = ds[3]
    for x1, y1, x2, y2 in s["boxes"].tolist():
        assert s["image"][int((y1 + y2) / 2), int((x1 + x2) / 2)].float().mean() > 150


def test_collate_in_a_dataloader_with_two_workers(manifest):
    ds = st.RecordDataset(manifest, transforms=_transforms(), seed=1, fields=["boxes", "classes"])
    dl = DataLoader(ds, batch_size=6, num_workers=2, collate_fn=ds.collate_fn())
    seen = 0
    for batch in dl:
        assert set(batch) == {"image", "label", "boxes", "classes"}
        assert batch["image"].shape == (6, 32, 32, 3) and batch["label"].dtype == torch.int64
        assert isinstance(batch["boxes"], list) and len(batch["boxes"]) == 6
        for r, boxes in enumerate(batch["boxes"]):
            assert torch.equal(boxes, ds[seen + r]["boxes"])
            assert len(batch["classes"][r]) == len(boxes)
        seen += 6
    assert seen == 24
    padded = ds.collate_fn(ragged="padded")([ds[i] for i in range(4)])
    values, lengths = padded["boxes"]
    assert lengths.tolist() == [len(ds[i]["boxes"]) for i in range(4)]
    assert values.shape == (4, int(lengths.max()), 4)
    assert not values[0].any()  # sample 0 has no boxes: all padding


def test_without_fields_the_sample_is_image_and_label(manifest):
    ds = st.RecordDataset(manifest, transforms=_transforms(), seed=5, fields=[])
    assert not ds.has_fields
    image, label = ds[4]
    assert image.shape == (32, 32, 3) and label == 1
    with_fields = st.RecordDataset(manifest, transforms=_transforms(), seed=5)
    assert torch.equal(with_fields[4]["image"], image)
    sized = st.RecordDataset(manifest, transforms=_transforms(), fields=["size"])[4]
    assert sized["size"].tolist() == [48, 56] and sized["size"].dtype == torch.int32
    with pytest.raises(SpecError, match="unknown fields"):
        st.RecordDataset(manifest, fields=["nope"])
    with pytest.raises(TypeError, match="list of field names"):
        st.RecordDataset(manifest, fields="boxes")


def test_a_plain_function_cannot_carry_boxes(manifest):
    with pytest.raises(SpecError, match="boxes"):
        st.RecordDataset(manifest, transforms=lambda img, rng: img)
