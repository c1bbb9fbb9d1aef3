"""The demo's data, shared by its stages: stage 01 makes ``WORK/images`` and packs
``WORK/train.rec``; a stage run on its own makes a small set first."""

from __future__ import annotations

from pathlib import Path


def ensure_data(work: Path, *, per_class: int = 40) -> tuple[Path, Path]:
    """``(images, rec)`` under ``work``, made (10 classes × ``per_class`` 112×112 JPEGs, then
    packed) when they are not there yet."""
    images, rec = work / "images", work / "train.rec"
    if not images.is_dir():
        from stoker.pack import make_sample_data

        print(f"making sample images in {images}")
        make_sample_data(images, classes=10, per_class=per_class, size=112)
    if not rec.exists():
        from stoker.pack import pack

        print(f"packing {images} -> {rec}")
        pack(images, rec, progress=False)
    return images, rec
