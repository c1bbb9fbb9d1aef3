"""An image folder read directly as a source, listed by the shared folder walk."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from stoker._core.files import IMAGE_EXTENSIONS, scan_folder
from stoker.loader.sources.base import Source, sha

__all__ = ["FolderSource"]


class FolderSource(Source):
    """An image folder read directly: one class per top-level subfolder (sorted by name).

    The folder is listed by :func:`stoker._core.files.scan_folder` (the walk ``stoker pack``
    uses: image extensions, hidden names and symlinks are treated the same way); the key of a
    file is its position in that listing, and its label the class index. ``class_names`` holds
    the folder names, ``files`` the paths relative to ``root``.
    """

    encoded = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)
        if not os.path.isdir(self.root):
            raise FileNotFoundError(f"image folder {self.root} does not exist")
        scan = scan_folder(self.root)
        if not scan.classes or not scan.items:  # files directly under root are no class
            raise FileNotFoundError(
                f"no images in {self.root}: expected one subfolder per class holding "
                f"{', '.join(sorted(IMAGE_EXTENSIONS))} files"
            )
        self.class_names = sorted(scan.classes, key=scan.classes.__getitem__)
        self.files = [item.rel for item in scan.items]
        self._labels = np.asarray([item.label for item in scan.items], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.files)

    def key(self, i: int) -> int:
        if not 0 <= i < len(self.files):
            raise IndexError(f"position {i} out of range for {len(self.files)} files")
        return int(i)

    def keys(self) -> np.ndarray:
        return np.arange(len(self.files), dtype=np.int64)

    def labels(self) -> np.ndarray:
        return self._labels

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.files[i])

    def read(self, i: int) -> tuple[Any, Any]:
        with open(self.path(i), "rb") as f:
            data = f.read()
        return data, self._labels[i]

    def describe(self, i: int) -> str:
        return f"key {i} ({self.path(i)})"

    def fingerprint(self) -> dict:
        listing = "\n".join(self.files).encode("utf-8", "surrogateescape")
        return {"type": "folder", "len": len(self.files), "sha": sha(listing)}
