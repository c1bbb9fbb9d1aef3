"""Detection: boxes and their classes, a different number per image, from listing to model.

End to end on the CPU in seconds:

1. draw JPEGs of coloured rectangles on a textured background (red, green, blue: classes 1, 2,
   3; none to three per image) and write a JSONL listing with each image's boxes and classes;
2. ``stoker.pack`` turns the listing into RecordIO shards whose records carry the fields;
3. ``stoker.Loader`` decodes and augments in worker processes; ``RandomResizedCrop`` and
   ``HorizontalFlip`` move the boxes with the pixels, drop the boxes cropped away and their
   classes with them; each batch carries the boxes padded with their counts;
4. ``CudaPrefetcher`` moves images and fields to the device (the CPU here) and
   ``detection_targets`` hands torchvision-style ``[{"boxes", "labels"}, ...]`` to a tiny
   centre-heatmap detector in a plain torch loop; the loss falls.

Along the way it checks that the boxes stayed on their rectangles: the colour under each box
after every crop and flip is its class's colour.

Run: ``python examples/detection.py [--images 160] [--epochs 4] [--workers 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import cv2
import numpy as np
import torch
from torch import nn

import stoker
from stoker.torch import CudaPrefetcher, detection_targets
from stoker.transforms import Compose, HorizontalFlip, RandomResizedCrop

SIZE = 96  # stored images
CROP = 64  # what the model sees
STRIDE = 4  # heatmap cell
COLOURS = {1: (220, 40, 40), 2: (40, 200, 40), 3: (50, 60, 230)}  # RGB per class
MEAN, STD = (0.5,) * 3, (0.25,) * 3  # 0-1 units, as transforms.Normalize takes them


def draw(rng: np.random.Generator) -> tuple[np.ndarray, list[list[float]], list[int]]:
    """One RGB image with 0-3 non-overlapping rectangles (one per horizontal band)."""
    img = rng.integers(60, 110, size=(SIZE, SIZE, 3), dtype=np.uint8)
    img = cv2.GaussianBlur(img, (5, 5), 0)
    boxes, classes = [], []
    band = SIZE // 3
    for j in range(int(rng.integers(0, 4))):
        h, w = int(rng.integers(12, band - 2)), int(rng.integers(14, SIZE // 2))
        y0 = j * band + int(rng.integers(0, band - h))
        x0 = int(rng.integers(0, SIZE - w))
        cls = int(rng.integers(1, 4))
        img[y0 : y0 + h, x0 : x0 + w] = COLOURS[cls]
        boxes.append([float(x0), float(y0), float(x0 + w), float(y0 + h)])
        classes.append(cls)
    return img, boxes, classes


def make_listing(root: str, n: int, seed: int) -> str:
    """Write ``n`` JPEGs under ``root/img`` and ``root/listing.jsonl`` naming their fields."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "img"), exist_ok=True)
    path = os.path.join(root, "listing.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            img, boxes, classes = draw(rng)
            name = f"img/{i:05d}.jpg"
            cv2.imwrite(os.path.join(root, name), img[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
            row = {"image": name, "label": len(boxes), "boxes": boxes, "classes": classes}
            f.write(json.dumps(row) + "\n")
    return path


class TinyCentreNet(nn.Module):
    """Three strided convs to a stride-4 grid; one logit per class per cell: "a box of this
    class is centred here"."""

    def __init__(self, classes: int) -> None:
        super().__init__()

        def block(i: int, o: int, stride: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1), nn.BatchNorm2d(o), nn.ReLU())

        self.body = nn.Sequential(block(3, 16, 2), block(16, 32, 2), block(32, 32, 1))
        self.head = nn.Conv2d(32, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def heatmaps(targets: list[dict[str, torch.Tensor]], classes: int, grid: int) -> torch.Tensor:
    """(B, classes, grid, grid) with 1 at each box's centre cell in its class channel."""
    out = torch.zeros(len(targets), classes, grid, grid)
    for b, t in enumerate(targets):
        if len(t["boxes"]):
            centre = (t["boxes"][:, :2] + t["boxes"][:, 2:]) / 2 / STRIDE
            cells = centre.long().clamp(0, grid - 1)
            out[b, t["labels"] - 1, cells[:, 1], cells[:, 0]] = 1.0
    return out


def colour_agreement(images: torch.Tensor, targets: list[dict[str, torch.Tensor]]) -> list[bool]:
    """Per box: does the middle of the box, in the augmented image, have its class's colour?"""
    # undo (x / 255 - MEAN) / STD back to 0-255 pixels
    rgb = (images * torch.tensor(STD).view(1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)) * 255
    palette = torch.tensor([COLOURS[c] for c in sorted(COLOURS)], dtype=torch.float32)
    out = []
    for img, t in zip(rgb, targets):
        for (x1, y1, x2, y2), cls in zip(t["boxes"].tolist(), t["labels"].tolist()):
            cx, cy = int((x1 + x2) / 2), int((y1 + y2) / 2)
            pixel = img[:, cy, cx]
            nearest = int(((palette - pixel) ** 2).sum(1).argmin()) + 1
            out.append(nearest == cls)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=160)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()

    with tempfile.TemporaryDirectory() as root:
        listing = make_listing(root, args.images, args.seed)
        report = stoker.pack(listing, os.path.join(root, "shapes"), workers=1, progress=False)
        print(f"packed {report.written} images with their boxes and classes")
        train = Compose([RandomResizedCrop(CROP, scale=(0.5, 1.0)), HorizontalFlip()])
        model = TinyCentreNet(len(COLOURS))
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(20.0))
        grid = CROP // STRIDE
        with stoker.Loader(
            report.manifest,
            batch_size=args.batch_size,
            transforms=train,
            fields=["boxes", "classes"],
            shuffle=True,
            seed=args.seed,
            workers=args.workers,
        ) as loader:
            batches = CudaPrefetcher(loader, mean=MEAN, std=STD)  # CUDA if there is one
            for epoch in range(args.epochs):
                losses, agree, counts = [], [], set()
                for batch in batches:
                    targets = detection_targets(batch)  # [{"boxes": (n, 4), "labels": (n,)}]
                    counts.update(len(t["boxes"]) for t in targets)
                    agree += colour_agreement(batch.images.cpu(), targets)
                    logits = model(batch.images)
                    loss = loss_fn(logits, heatmaps(targets, len(COLOURS), grid).to(logits))
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
                print(
                    f"epoch {epoch}: loss {np.mean(losses):.3f}, boxes per image "
                    f"{sorted(counts)}, boxes on their colour {np.mean(agree):.1%}"
                )
    print(f"done in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
