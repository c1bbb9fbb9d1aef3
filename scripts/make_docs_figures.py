"""Draw docs/figures/transforms.png: one sample image and each transform applied to it.

    python scripts/make_docs_figures.py [--out docs/figures/transforms.png]

Each panel's randomness comes from ``sample_rng(seed=0, epoch=0, index)``, so the figure is the
same on every run.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

from stoker._core.atomic import write_bytes_atomic
from stoker._core.seeding import sample_rng
from stoker.transforms import (
    CenterCrop,
    ColorJitter,
    GaussianBlur,
    Grayscale,
    HorizontalFlip,
    Normalize,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    Rotate,
    ScaleTranslate,
    Sharpen,
    Shear,
    SineWarp,
    Smooth,
    get_preset,
)

ROOT = Path(__file__).resolve().parent.parent
SIZE = 128


def sample() -> np.ndarray:
    """The packer's sample image when available, else a drawn stand-in."""
    try:
        from stoker.pack.sample_data import sample_image

        return np.ascontiguousarray(sample_image(3, 2, 7, size=SIZE))
    except ImportError:
        import cv2

        y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
        img = np.stack([200 * x + 30, 180 * y + 40, 120 + 80 * x * y], axis=-1).astype(np.uint8)
        cv2.circle(img, (70, 60), 30, (220, 60, 40), -1)
        cv2.line(img, (10, 110), (118, 20), (20, 20, 20), 3)
        return img


def panels() -> list[tuple[str, object, int]]:
    """(label, transform, sample index for its generator); index 0 unless a random crop at
    index 0 happens to miss the object."""
    items: list[tuple[str, object]] = [
        ("Resize((96, 128))", Resize((96, 128))),
        ("CenterCrop(80)", CenterCrop(80)),
        ("RandomCrop(96, padding=8)", RandomCrop(96, padding=8)),
        ("RandomResizedCrop(128)", RandomResizedCrop(SIZE)),
        ("HorizontalFlip(p=1)", HorizontalFlip(1.0)),
        ("Rotate, at +15°", Rotate((15, 15))),
        ("Shear, sx = sy = 0.2", Shear((0.2, 0.2), (0.2, 0.2))),
        ("Shear, sx = 0.2, center=True", Shear((0.2, 0.2), 0, center=True)),
        ("ScaleTranslate(50, 125)", ScaleTranslate(50, 125)),
        ("SineWarp, amplitude 0.2", SineWarp((0.2, 0.2))),
        ("GaussianBlur, radius 1.2", GaussianBlur((1.2, 1.2))),
        ("Sharpen()", Sharpen()),
        ("Smooth()", Smooth()),
        ("ColorJitter(0.4, 0.4, 0.4)", ColorJitter(0.4, 0.4, 0.4)),
        ("Grayscale(3)", Grayscale(3)),
        ("Normalize(0.5, 0.5)", Normalize(0.5, 0.5)),
        ("preset 'seed000-uint8'", get_preset("seed000-uint8", size=112)),
        ("preset 'kanji'", get_preset("kanji", size=SIZE)),
        ("preset 'imagenet'", get_preset("imagenet", size=112)),
    ]
    zoom = {"RandomResizedCrop(128)": 7, "preset 'imagenet'": 7}
    return [(name, op, zoom.get(name, 0)) for name, op in items]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures" / "transforms.png")
    args = ap.parse_args(argv)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = sample()
    items = [("input", img), *((name, op(img, sample_rng(0, 0, i))) for name, op, i in panels())]
    cols = 5
    rows = -(-len(items) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 2.2, rows * 2.7))
    for ax, (name, out) in zip(axes.flat, items):
        arr = np.asarray(out)
        if arr.dtype != np.uint8:  # Normalize: map [-1, 1] back for display
            arr = np.clip((arr + 1.0) * 127.5, 0, 255).astype(np.uint8)
        ax.imshow(arr, cmap="gray" if arr.ndim == 2 else None, vmin=0, vmax=255)
        ax.set_title(f"{name}\n{arr.shape[0]}×{arr.shape[1]}", fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    for ax in list(axes.flat)[len(items) :]:
        ax.axis("off")
    fig.suptitle("stoker.transforms on one sample image", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    from PIL import Image  # dropping the alpha channel keeps the file smaller

    buf.seek(0)
    rgb = Image.open(buf).convert("RGB")
    buf = io.BytesIO()
    rgb.save(buf, format="PNG", optimize=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(args.out, buf.getvalue())
    print(f"wrote {args.out} ({len(buf.getvalue()) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
