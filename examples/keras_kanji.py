"""Seed-002 recipe: a Keras 3 classifier on glyph images held in RAM, fed by stoker.

The arrays ``x`` (N, 64, 64) and ``y`` (N,) live in memory; ``stoker.Loader`` places them once
in shared memory (one copy, whatever the worker count); each batch holds every sample twice,
as it is and distorted by one geometric op (rotate, shear, scale-translate or sine warp) and
one filter (blur, sharpen or smooth); ``model.fit`` reads it through ``KerasDataset``, so
Keras never forks and the worker processes do the augmentation.

    KERAS_BACKEND=torch python examples/keras_kanji.py [--epochs 4] [--workers 2]

The glyphs are synthetic: each class is a random set of strokes (lines and arcs), drawn
with jitter per sample, so the script needs no download.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "torch")


def make_glyphs(
    n: int, *, classes: int = 20, size: int = 64, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` kanji-like glyphs: uint8 (n, size, size) white strokes on black, int64 labels.

    Each class has 3-6 strokes (lines and arcs) in a fixed layout; every sample redraws them
    with endpoints moved by up to size/20 and a random stroke width, so classes overlap a
    little and a classifier has something to learn.
    """
    import cv2

    rng = np.random.default_rng(seed)
    m = size // 8  # margin
    protos = []
    for _ in range(classes):
        strokes = []
        for _ in range(int(rng.integers(3, 7))):
            if rng.random() < 0.7:
                strokes.append(("line", rng.integers(m, size - m, 4)))
            else:
                c = rng.integers(size // 3, 2 * size // 3, 2)
                axes = rng.integers(size // 8, size // 3, 2)
                start = int(rng.integers(0, 360))
                strokes.append(("arc", (c, axes, start, start + int(rng.integers(90, 240)))))
        protos.append(strokes)
    y = rng.integers(0, classes, n).astype(np.int64)
    x = np.zeros((n, size, size), np.uint8)
    jit = max(1, size // 20)
    for i in range(n):
        img = x[i]
        width = int(rng.integers(2, 4))
        for kind, p in protos[y[i]]:
            if kind == "line":
                a, b, c, d = (int(v) for v in p + rng.integers(-jit, jit + 1, 4))
                cv2.line(img, (a, b), (c, d), 255, width, cv2.LINE_AA)
            else:
                (cx, cy), (ax, ay), s, e = p[0], p[1], p[2], p[3]
                dx, dy = rng.integers(-jit, jit + 1, 2)
                cv2.ellipse(
                    img,
                    (int(cx + dx), int(cy + dy)),
                    (int(ax), int(ay)),
                    0.0,
                    float(s),
                    float(e),
                    255,
                    width,
                    cv2.LINE_AA,
                )
    return x, y


def build_model(classes: int, size: int = 64):
    import keras

    return keras.Sequential(
        [
            keras.Input((size, size, 1)),
            keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            keras.layers.Conv2D(64, 3, strides=2, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(classes),
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=4000, help="number of glyphs (default 4000)")
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=128, help="images per batch (even)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    import keras

    import stoker
    from stoker.keras import KerasDataset
    from stoker.transforms.presets import kanji_distort

    if keras.backend.backend() == "torch":
        import torch

        if not torch.cuda.is_available():
            # Training on the CPU: leave the loader's workers their cores, or torch's threads
            # and the workers take turns and every step stalls.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) - args.workers))

    t0 = time.perf_counter()
    x, y = make_glyphs(args.n, classes=args.classes)
    cut = args.n * 9 // 10
    print(f"{args.n} glyphs of 64x64 in {time.perf_counter() - t0:.1f} s, {args.classes} classes")

    # Training batches: half original, half distorted (pair_with), reshuffled every epoch.
    train = stoker.Loader(
        (x[:cut], y[:cut]),
        batch_size=args.batch_size,
        pair_with=kanji_distort(64),
        shuffle=True,
        seed=0,
        workers=args.workers,
    )
    val = stoker.Loader((x[cut:], y[cut:]), batch_size=args.batch_size, workers=1)

    model = build_model(args.classes)
    model.compile(
        optimizer=keras.optimizers.Adam(2e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    t0 = time.perf_counter()
    with KerasDataset(train, x_dtype="float32") as tr, KerasDataset(val, x_dtype="float32") as va:
        hist = model.fit(tr, validation_data=va, epochs=args.epochs, verbose=2)
    dt = time.perf_counter() - t0
    images = args.epochs * len(tr) * args.batch_size
    print(
        f"fit: {args.epochs} epochs in {dt:.1f} s ({images / dt:.0f} training images/s); "
        f"accuracy {hist.history['accuracy'][-1]:.3f}, "
        f"validation accuracy {hist.history['val_accuracy'][-1]:.3f}"
    )


if __name__ == "__main__":
    main()
