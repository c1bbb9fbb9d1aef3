"""An image folder read directly, as a :class:`~stoker.formats.Reader`, listed by the shared
folder walk.

The listing is one packed blob: the relative paths, UTF-8 (``surrogateescape``), joined by
``"\\n"`` (the bytes the fingerprint hashes), plus an int64 array of where each path starts
(``offsets[i + 1] - 1`` is where path ``i`` ends) and the int64 labels. ``share()`` (the
loader calls it before it starts workers) moves all three into one anonymous shared mapping
(``_shm.SharedFd``): workers get its descriptor with their start and map it read-only, so the
listing exists once however many workers read it and however many files the folder holds
(docs/loader.md has the figures). Where there is no ``memfd`` (macOS, Windows) the mapping is
a named ``multiprocessing.shared_memory`` segment (``_named.NamedRing``), mapped by name.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from stoker._core.files import IMAGE_EXTENSIONS, scan_folder
from stoker.loader import _shm
from stoker.loader._named import NamedRing
from stoker.loader.sources.base import PositionKeyed, sha

__all__ = ["FileList", "FolderSource"]

_ENC = ("utf-8", "surrogateescape")


def _pack(files: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """(blob, offsets) of ``files``: blob = the paths joined by newlines, encoded."""
    encoded = [f.encode(*_ENC) for f in files]
    lengths = np.fromiter((len(e) + 1 for e in encoded), dtype=np.int64, count=len(encoded))
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    blob = np.frombuffer(b"\n".join(encoded), dtype=np.uint8)
    return blob, offsets


def _entry(blob: np.ndarray, offsets: np.ndarray, j: int) -> str:
    """Relative path ``j`` of a packed listing (``offsets`` count each path with its separator)."""
    a, b = int(offsets[j]), int(offsets[j + 1]) - 1
    return blob[a:b].tobytes().decode(*_ENC)


class FileList(Sequence[str]):
    """The relative paths of a :class:`FolderSource` (its ``listing``), decoded one at a time from its packed
    listing (a sequence: ``len``, indexing, slicing, ``index``, ``in``, ``==`` with a list)."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray) -> None:
        self._blob, self._offsets = blob, offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"file {i} out of range for {n} files")
        return _entry(self._blob, self._offsets, j)

    def __iter__(self) -> Iterator[str]:
        if len(self):
            yield from self._blob.tobytes().decode(*_ENC).split("\n")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileList):
            return self._blob.tobytes() == other._blob.tobytes() and np.array_equal(
                self._offsets, other._offsets
            )
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        head = ", ".join(repr(f) for f in self[:3])
        return f"FileList([{head}{', ...' if len(self) > 3 else ''}], {len(self)} files)"


def _close(shared: _shm.SharedFd | NamedRing) -> None:
    shared.close()


class FolderSource(PositionKeyed):
    """An image folder read directly: one class per top-level subfolder (sorted by name).

    The folder is listed by :func:`stoker._core.files.scan_folder` (the walk ``stoker pack``
    uses: image extensions, hidden names and symlinks are treated the same way); the key of a
    file is its position in that listing, and its label the class index. ``class_names`` holds
    the folder names, ``listing`` the paths relative to ``root`` (a read-only sequence),
    ``file_path(i)`` the path of sample ``i``.
    """

    _unit = "files"

    encoded = True

    def __init__(self, root: str | os.PathLike[str]) -> None:
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"image folder {root} does not exist")
        scan = scan_folder(root)
        if not scan.classes or not scan.items:  # files directly under root are no class
            flat = "" if scan.classes else f" ({len(scan.items)} images directly in it)"
            raise FileNotFoundError(
                f"no images in class subfolders of {root}{flat}: expected one subfolder per "
                f"class holding {', '.join(sorted(IMAGE_EXTENSIONS))} files"
            )
        class_names = sorted(scan.classes, key=scan.classes.__getitem__)
        labels = np.fromiter((it.label for it in scan.items), np.int64, count=len(scan.items))
        self._init(root, (it.rel for it in scan.items), labels, class_names)

    @classmethod
    def _from_listing(
        cls, root: str, files: Iterable[str], labels: Any, class_names: list[str]
    ) -> FolderSource:
        """A source over a listing made elsewhere (the memory bench; tests): no walk."""
        self = cls.__new__(cls)
        self._init(os.fspath(root), files, np.asarray(labels, dtype=np.int64), class_names)
        return self

    def _init(
        self, root: str, files: Iterable[str], labels: np.ndarray, class_names: list[str]
    ) -> None:
        self.root = self.path = root
        self._class_names = list(class_names)
        self._blob, self._offsets = _pack(files)
        self._labels = labels
        if len(labels) != len(self._offsets) - 1:
            raise ValueError(f"{len(labels)} labels for {len(self._offsets) - 1} files")
        self._shared: _shm.SharedFd | NamedRing | None = None
        self._mapping: Any = None
        self._finalizer: Any = None
        self._fp: dict | None = None

    @property
    def listing(self) -> FileList:
        """The image files' paths relative to ``root``, in position order."""
        return FileList(self._blob, self._offsets)

    @property
    def class_names(self) -> list[str]:
        return self._class_names

    def files(self) -> list[str]:
        """Every image file's path (the Reader's data files)."""
        return [os.path.join(self.root, f) for f in self.listing]

    @property
    def shared(self) -> bool:
        """Whether the listing lives in shared memory (after ``share()``)."""
        return self._shared is not None

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def labels(self) -> np.ndarray:
        return self._labels

    def file_path(self, i: int) -> str:
        """The path of sample ``i``'s image file."""
        return os.path.join(self.root, _entry(self._blob, self._offsets, i))

    def read(self, i: int) -> tuple[Any, Any]:
        with open(self.file_path(i), "rb") as f:
            data = f.read()
        return data, self._labels[i]

    def describe(self, i: int) -> str:
        return f"key {i} ({self.file_path(i)})"

    def fingerprint(self) -> dict:
        if self._fp is None:
            self._fp = {"type": "folder", "len": len(self), "sha": sha(self._blob.tobytes())}
        return self._fp

    # ------------------------------------------------------------------ sharing
    def share(self) -> None:
        """Move the listing (blob, offsets, labels) into one anonymous shared mapping, once."""
        if self._shared is not None:
            return
        parts = (self._blob, self._offsets, self._labels)
        starts = [0]
        for p in parts:
            starts.append(starts[-1] + (p.nbytes + 63) // 64 * 64)
        _shm.preflight(starts[-1], slots=1, what="folder listings", where="memory")
        shared: _shm.SharedFd | NamedRing
        if hasattr(os, "memfd_create"):
            shared, mapping = _shm.SharedFd.create(starts[-1], name="stoker-listing")
        else:
            shared, mapping = NamedRing.create(max(starts[-1], 1))
        mem = mapping.array()
        views = []
        for p, at in zip(parts, starts):
            v = mem[at : at + p.nbytes].view(p.dtype)
            v[:] = p
            views.append(v)
        self._blob, self._offsets, self._labels = views
        self._shared, self._mapping = shared, mapping
        self._finalizer = weakref.finalize(self, _close, shared)

    def __getstate__(self) -> dict:
        state: dict[str, Any] = {
            "root": self.root,
            "class_names": self._class_names,
            "n": (self._blob.size, self._offsets.size),
            "fp": self._fp,
        }
        if self._shared is not None and (_shm.handing_to_child() or _shm.is_probing()):
            state["shared"] = self._shared  # its descriptor goes with the process start
        else:  # a copy: another process than a starting worker, or not shared (yet)
            state["arrays"] = (self._blob, self._offsets, self._labels)
        return state

    def __setstate__(self, state: dict) -> None:
        self.root, self._class_names, self._fp = state["root"], state["class_names"], state["fp"]
        self.path = self.root
        self._finalizer = None
        self._mapping = None
        self._shared = None  # a worker does not own the listing
        if "arrays" in state:
            self._blob, self._offsets, self._labels = state["arrays"]
            return
        shared: _shm.SharedFd | NamedRing = state["shared"]
        mapping = shared.attach(writable=False)  # the descriptor is closed once mapped
        mem = mapping.array()
        nb, no = state["n"]
        at = 0
        out = []
        for count, dtype in ((nb, np.uint8), (no, np.int64), (no - 1, np.int64)):
            size = count * np.dtype(dtype).itemsize
            out.append(mem[at : at + size].view(dtype))
            at += (size + 63) // 64 * 64
        self._blob, self._offsets, self._labels = out
        self._mapping = mapping

    def close(self) -> None:
        """Close the listing's descriptor (the mapping stays while this source uses it)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._shared = None  # a later share() makes a new one from the views kept here
