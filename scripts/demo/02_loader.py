"""Demo stage 02: timed epochs of the naive pipeline beside stoker, same images, same
augmentation (resize 128 -> random crop 112 -> flip -> float32 normalised, NCHW).
Two epochs each, as a training loop runs them: the first includes starting the workers.

naive:  PIL image-folder dataset through torch.utils.data.DataLoader (torchvision's behaviour
        written out: PIL open -> convert RGB -> resize 128 -> random crop 112 -> flip ->
        ToTensor + Normalize)
stoker: stoker.Loader over WORK/train.rec

Usage: python scripts/demo/02_loader.py WORK   (stage 01 leaves WORK/images and WORK/train.rec;
when they are missing this stage makes them).
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import numpy as np
from _data import ensure_data

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
WORKERS = 2
BATCH = 256


class NaiveFolder:
    """What `torchvision.datasets.ImageFolder(root, transform=T.Compose([...]))` does."""

    def __init__(self, root: str) -> None:
        classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
        self.samples = [
            (os.path.join(root, c, f), i)
            for i, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))
            if f.lower().endswith((".jpg", ".jpeg", ".png"))
        ]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image

        path, label = self.samples[i]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        w, h = img.size  # Resize(128): the shorter side becomes 128
        nw, nh = (128, int(128 * h / w)) if w <= h else (int(128 * w / h), 128)
        img = img.resize((nw, nh), Image.BILINEAR)
        x, y = random.randint(0, nw - 112), random.randint(0, nh - 112)  # RandomCrop(112)
        img = img.crop((x, y, x + 112, y + 112))
        if random.random() < 0.5:  # RandomHorizontalFlip
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        t = torch.from_numpy(np.array(img, dtype=np.uint8)).permute(2, 0, 1).float().div(255)
        t = (t - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
        return t, label


EPOCHS = 2


def naive_epochs(images: Path) -> list[tuple[int, float]]:
    """Seconds per epoch of a training loop over a DataLoader (workers forked each epoch)."""
    import torch

    torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(
        NaiveFolder(str(images)), batch_size=BATCH, shuffle=True, num_workers=WORKERS
    )
    out = []
    for _ in range(EPOCHS):
        t0 = time.perf_counter()
        n = sum(len(x) for x, _ in loader)
        out.append((n, time.perf_counter() - t0))
    return out


def stoker_epochs(rec: Path) -> tuple[list[tuple[int, float]], float]:
    """Seconds per epoch over one stoker.Loader (workers persist), and the first-batch time."""
    import stoker
    from stoker.transforms import Compose, HorizontalFlip, Normalize, RandomCrop, Resize

    transforms = Compose(
        [Resize(128, shorter_side=True), RandomCrop(112), HorizontalFlip(), Normalize(MEAN, STD)]
    )
    out = []
    first = None
    t_start = time.perf_counter()
    with stoker.Loader(
        str(rec),
        batch_size=BATCH,
        transforms=transforms,
        layout="NCHW",
        shuffle=True,
        workers=WORKERS,
        seed=0,
    ) as loader:
        for _ in range(EPOCHS):
            t0 = time.perf_counter()
            n = 0
            for images, _labels in loader:
                if first is None:
                    first = time.perf_counter() - t_start
                n += len(images)
            out.append((n, time.perf_counter() - (t_start if not out else t0)))
    return out, first or 0.0


def main() -> int:
    work = Path(sys.argv[1] if len(sys.argv) > 1 else "demo-data").resolve()
    work.mkdir(parents=True, exist_ok=True)
    images, rec = ensure_data(work, per_class=300)
    naive = naive_epochs(images)
    fast, first = stoker_epochs(rec)
    for e in range(EPOCHS):
        (na, sa), (nc, sc) = naive[e], fast[e]
        print(
            f"epoch {e + 1}: naive (PIL ImageFolder + DataLoader, {WORKERS} workers) "
            f"{na / sa:,.0f} images/s | stoker (Loader over {rec.name}, {WORKERS} workers) "
            f"{nc / sc:,.0f} images/s | stoker/naive = {(nc / sc) / (na / sa):.1f}x"
        )
    print(f"stoker's first batch arrived {first:.2f} s after Loader() (epoch 1 includes it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
