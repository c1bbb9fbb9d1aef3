"""A timm ImageNet training recipe's data side, ported to stoker.

timm's ``train.py --aa rand-m9-mstd0.5-inc1 --mixup 0.8 --cutmix 1.0 --smoothing 0.1
--reprob 0.25`` builds, per sample, RandomResizedCrop(224) -> RandomHorizontalFlip ->
RandAugment("rand-m9-mstd0.5-inc1") -> ToTensor -> Normalize -> RandomErasing(0.25), and per
batch ``Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)`` with a soft-target
cross-entropy. In stoker:

- the per-sample chain runs in the loader's workers, in uint8: ``RandomResizedCrop``,
  ``HorizontalFlip``, ``RandAugment.from_timm(...)``;
- MixUp/CutMix run in the workers too, on each batch's rows, and the labels arrive as soft
  targets (``Loader(mix=MixUpCutMix(...))``);
- normalisation and random erasing run on the device (``CudaPrefetcher(mean=, std=,
  erase_p=)``), on uint8 batches a quarter the size of float ones.

Every draw is a function of (seed, epoch, index) or (seed, epoch, batch): a run resumed from
``loader.state_dict()`` on as many ranks sees the same crops, ops and mixed pairs.

End to end on the CPU in seconds, on small sample images (64 px crops of 96 px JPEGs, 4
classes) and a tiny model; the loss is printed per epoch.

Run: ``python examples/timm_recipe.py [--images 160] [--epochs 2] [--workers 2]``
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from torch import nn

import stoker
from stoker.torch import CudaPrefetcher
from stoker.transforms import (
    Compose,
    HorizontalFlip,
    MixUpCutMix,
    RandAugment,
    RandomResizedCrop,
)

CLASSES = 4
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def recipe(size: int) -> Compose:
    """timm's training transforms before ToTensor (``transforms_imagenet_train``)."""
    return Compose(
        [
            RandomResizedCrop(size, interpolation="bicubic"),
            HorizontalFlip(),
            RandAugment.from_timm("rand-m9-mstd0.5-inc1"),  # fill: the ImageNet mean, as timm
        ]
    )


def soft_target_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """timm's ``SoftTargetCrossEntropy``: the loss for mixed, smoothed targets."""
    return torch.sum(-targets * torch.log_softmax(logits, dim=-1), dim=-1).mean()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=160)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stoker-timm-")
    per_class = max(1, args.images // CLASSES)
    folder = stoker.make_sample_data(
        os.path.join(work, "images"), classes=CLASSES, per_class=per_class, size=96
    )
    stoker.pack(folder, os.path.join(work, "set", "train"), progress=False)

    loader = stoker.Loader(
        os.path.join(work, "set", "train.stoker.json"),
        batch_size=32,
        transforms=recipe(64),
        mix=MixUpCutMix(0.8, 1.0, num_classes=CLASSES, label_smoothing=0.1),
        layout="NCHW",
        shuffle=True,
        seed=0,
        workers=args.workers,
    )
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, CLASSES),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with loader:
        batches = CudaPrefetcher(loader, mean=MEAN, std=STD, erase_p=0.25)
        for epoch in range(args.epochs):
            total, n = 0.0, 0
            for batch in batches:
                loss = soft_target_cross_entropy(model(batch.images), batch.labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                total, n = total + loss.item() * len(batch.labels), n + len(batch.labels)
            print(f"epoch {epoch}: {n} images, soft-target loss {total / n:.3f}")


if __name__ == "__main__":
    main()
