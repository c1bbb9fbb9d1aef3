"""Long-tailed classification: class-balanced sampling and class-weighted loss (seed 001).

Eight synthetic classes of small noisy images with a long tail (512 samples of the first
class down to 4 of the last); the classes overlap, so the class prior matters. The same small
model is trained three ways, each reading the data through ``stoker.Loader`` with worker
processes:

- ``plain``: shuffled epochs, plain cross-entropy — the tail classes are mostly ignored;
- ``sampler``: ``ClassBalanced`` (inverse frequency; it works across ranks too, unlike
  ``WeightedRandomSampler``);
- ``loss``: shuffled epochs, ``CrossEntropyLoss(weight=class_weights(labels))``.

It prints how often each class was drawn in one epoch and the per-class accuracy on a balanced
test set: plain training sacrifices the tail; both remedies raise the balanced accuracy (with
the default settings about 0.30 -> 0.57 with the sampler and 0.49 with the weighted loss).
Runs on CPU in well under a minute.

Run: ``python examples/long_tailed.py [--epochs 6] [--workers 2]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

import stoker
from stoker.sampling import ClassBalanced
from stoker.train import class_weights

COUNTS = [512, 256, 128, 64, 32, 16, 8, 4]
SIZE = 16


def make_data(
    counts: list[int], seed: int, noise: float, signal: float
) -> tuple[np.ndarray, np.ndarray]:
    """Class c: a fixed smooth pattern (the same for every seed offset) plus heavy noise."""
    templates = np.random.default_rng(1000).normal(0, 1, (len(counts), 4, 4, 3))
    templates = templates.repeat(SIZE // 4, 1).repeat(SIZE // 4, 2)  # blocky 16x16 patterns
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(len(counts)), counts)
    x = 128 + signal * templates[y] + rng.normal(0, noise, (len(y), SIZE, SIZE, 3))
    return np.clip(x, 0, 255).astype(np.uint8), y.astype(np.int64)


class Classifier(nn.Module):
    """Average 4x4 blocks (where the class signal lives), then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.AvgPool2d(4)
        self.fc = nn.Linear((SIZE // 4) ** 2 * 3, len(COUNTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, W, C) -> (B, classes)
        return self.fc(self.pool(x.permute(0, 3, 1, 2)).flatten(1))


def train(
    mode: str, x: np.ndarray, y: np.ndarray, args: argparse.Namespace
) -> tuple[nn.Module, np.ndarray]:
    torch.manual_seed(args.seed)
    model = Classifier()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    weight = None
    if mode == "loss":
        weight = torch.as_tensor(class_weights(y), dtype=torch.float32)
    loss_fn = nn.CrossEntropyLoss(weight=weight)
    sampler = ClassBalanced(y, seed=args.seed) if mode == "sampler" else None
    drawn = np.zeros(len(COUNTS), dtype=np.int64)
    with stoker.Loader(
        (x, y), batch_size=64, sampler=sampler, shuffle=True, seed=args.seed, workers=args.workers
    ) as loader:
        for epoch in range(args.epochs):
            for batch in loader:
                labels = torch.from_numpy(np.asarray(batch.labels, dtype=np.int64)).reshape(-1)
                if epoch == 0:
                    drawn += np.bincount(labels.numpy(), minlength=len(COUNTS))
                inputs = (torch.from_numpy(batch.images).float() - 128) / 64
                loss = loss_fn(model(inputs), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
    return model, drawn


def per_class_accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        pred = model((torch.from_numpy(x).float() - 128) / 64).argmax(1).numpy()
    return np.array([np.mean(pred[y == c] == c) for c in range(len(COUNTS))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--noise", type=float, default=60.0)
    ap.add_argument("--signal", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.perf_counter()
    x, y = make_data(COUNTS, args.seed, args.noise, args.signal)
    x_test, y_test = make_data([100] * len(COUNTS), args.seed + 1, args.noise, args.signal)
    print(f"train: {len(y)} samples, per class {COUNTS}; test: 100 per class")
    print(f"class_weights (inverse, mean 1 per sample): {np.round(class_weights(y), 2).tolist()}")
    header = "class".ljust(10) + "".join(f"{c:>7d}" for c in range(len(COUNTS)))
    results = {}
    for mode in ("plain", "sampler", "loss"):
        model, drawn = train(mode, x, y, args)
        results[mode] = (drawn, per_class_accuracy(model, x_test, y_test))
    print("\nshare of each class in the first epoch's batches")
    print(header)
    for mode, (drawn, _) in results.items():
        print(mode.ljust(10) + "".join(f"{v:7.3f}" for v in drawn / drawn.sum()))
    print("\nper-class test accuracy (balanced accuracy = their mean)")
    print(header + "   balanced")
    for mode, (_, acc) in results.items():
        print(mode.ljust(10) + "".join(f"{v:7.2f}" for v in acc) + f"{acc.mean():11.3f}")
    print(f"\ndone in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
