"""Demo stage 04: a few training steps of a small CNN fed by stoker.Loader through
CudaPrefetcher (on the GPU when there is one, else the same code on the CPU), printing for each
step how much of it was spent waiting for data.

Usage: python scripts/demo/03_train.py WORK   (earlier stages leave WORK/images and
WORK/train.rec; when they are missing this stage makes a small set).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from _data import ensure_data

MEAN = (0.485, 0.456, 0.406)  # 0-1 units: the prefetcher divides uint8 batches by 255 first
STD = (0.229, 0.224, 0.225)
STEPS = 8
BATCH = 32
WORKERS = 2


def small_cnn(classes: int):
    from torch import nn

    def block(cin: int, cout: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.MaxPool2d(2),
        )  # fmt: skip

    return nn.Sequential(
        block(3, 16), block(16, 32), block(32, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes),
    )  # fmt: skip


def main(work: Path) -> int:
    import torch

    import stoker
    from stoker.torch import CudaPrefetcher
    from stoker.transforms import Compose, RandomCrop, Resize

    _, rec = ensure_data(work)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        torch.set_num_threads(2)
    torch.manual_seed(0)
    # CPU workers decode, resize and crop; the flip and normalisation happen on the device
    transforms = Compose([Resize(72), RandomCrop(64)])
    with stoker.Loader(
        rec,
        batch_size=BATCH,
        transforms=transforms,
        shuffle=True,
        seed=0,
        workers=WORKERS,
        drop_last=True,
    ) as loader:
        classes = int(loader.source.labels().max()) + 1
        model = small_cnn(max(classes, 2)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        batches = CudaPrefetcher(loader, device=device, mean=MEAN, std=STD, flip_p=0.5, seed=0)
        where = (
            f"GPU {torch.cuda.get_device_name(device)}" if cuda else "CPU (no CUDA here; same code)"
        )
        print(
            f"training a small CNN on {where}: batch {BATCH}, 64x64 crops, "
            f"{WORKERS} loader workers, {len(loader)} batches per epoch"
        )
        print(f"{'step':>4} {'loss':>7} {'step ms':>8} {'wait ms':>8} {'waiting':>8}")
        step = 0
        total_wait = total_time = 0.0
        while step < STEPS:
            it = iter(batches)
            t_prev = time.perf_counter()
            while step < STEPS:
                try:
                    images, labels = next(it)
                except StopIteration:
                    break
                t_data = time.perf_counter()
                loss = loss_fn(model(images), labels.long())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                value = loss.item()  # waits for the step to finish on the device
                t_end = time.perf_counter()
                wait, dt = t_data - t_prev, t_end - t_prev
                total_wait += wait
                total_time += dt
                step += 1
                print(
                    f"{step:>4} {value:>7.3f} {1000 * dt:>8.1f} {1000 * wait:>8.1f} "
                    f"{100 * wait / dt:>7.1f}%"
                )
                t_prev = time.perf_counter()
            it.close()
    print(
        f"data-wait share over {step} steps: {100 * total_wait / total_time:.1f}% "
        f"({1000 * total_wait / step:.1f} ms of {1000 * total_time / step:.1f} ms per step)"
    )
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
