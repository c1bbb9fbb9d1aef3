"""Which files are images, and the one walk over an image folder.

Every room that lists a folder (``stoker pack``, the loader's folder source, the doctor) walks
it here, so they agree on what a class is, which files count and in which order.

Folder rules:

- Classes are the top-level subfolders, numbered in sorted (code point) order from 0; an empty
  class folder keeps its number. Images in deeper folders belong to their top-level class.
- Files directly under the root get label 0 when the root has no class folders, and are
  ignored otherwise.
- Order: class by class; inside a class, a folder's files in sorted order, then its subfolders
  depth first in sorted order. The position in this order is a folder sample's key.
- Names that start with ``.`` (hidden files and folders, such as macOS ``._*`` companions or
  ``.ipynb_checkpoints``) are ignored. The note ``stoker sample-data`` leaves at a folder's root
  (:data:`SAMPLE_MARKER`) is stoker's own and is not counted at all.
- Extension allow-list (case-insensitive): :data:`IMAGE_EXTENSIONS`; other files are counted
  as ignored. Content is checked by magic bytes when it is read, not by extension.
- Symlinks: with ``follow_symlinks=False`` (default) a link to a file inside the root is kept,
  a link that leads outside the root is rejected ``outside_root``, a dangling link (or a
  loop) ``broken_link``, and a link to a folder is not followed (counted as ignored). With
  ``follow_symlinks=True`` links are followed anywhere; each folder is entered once (by
  device and inode), so loops end.
- Anything that is not a regular file (FIFO, socket, device) is rejected ``not_a_file``:
  reading one could block forever.

Names are kept as ``str`` with ``surrogateescape`` for bytes that are not UTF-8
(``os.fsencode`` gives the exact bytes back).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

__all__ = [
    "IMAGE_EXTENSIONS",
    "Item",
    "inside",
    "SAMPLE_MARKER",
    "ScanResult",
    "is_image_name",
    "scan_folder",
]

#: The file ``stoker sample-data`` writes at the root of the folder it makes (its settings).
SAMPLE_MARKER = ".stoker-sample.json"

#: The file types stoker reads as images, in every room.
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm"}
)


def is_image_name(name: str) -> bool:
    """Whether a file name has one of :data:`IMAGE_EXTENSIONS` (case-insensitive)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


@dataclass(frozen=True)
class Item:
    """One file to pack: its path, its path relative to the root, and its label."""

    path: str
    rel: str
    label: float | tuple[float, ...]
    key: int | None = None  # from a .lst index; None for folders (key = position)


@dataclass
class ScanResult:
    """What a walk found: the items to read, the class map, and the counts of what it left."""

    items: list[Item]
    classes: dict[str, int]
    found: int = 0
    ignored: int = 0
    rejects: list[tuple[str, str, str]] = field(default_factory=list)  # (rel, reason, detail)
    ignored_links: int = 0
    unclassified: int = 0


def inside(path: str, root_real: str) -> bool:
    """Whether the real path ``path`` is ``root_real`` or lies under it."""
    return path == root_real or path.startswith(root_real.rstrip(os.sep) + os.sep)


def scan_folder(root: str | os.PathLike[str], *, follow_symlinks: bool = False) -> ScanResult:
    """List the images under ``root`` in a fixed order (class, then sorted path)."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise NotADirectoryError(f"{root}: not a folder")
    root_real = os.path.realpath(root)
    res = ScanResult(items=[], classes={})
    seen_dirs: set[tuple[int, int]] = set()
    st = os.stat(root)
    seen_dirs.add((st.st_dev, st.st_ino))

    top_files: list[os.DirEntry] = []
    class_dirs: list[tuple[str, str]] = []  # (name, path)
    try:
        entries = sorted(
            (e for e in os.scandir(root) if e.name != SAMPLE_MARKER), key=lambda e: e.name
        )
    except OSError as e:
        raise OSError(e.errno, f"{root}: cannot list the folder: {e.strerror or e}") from None
    for entry in entries:
        kind = _classify(entry, root_real, follow_symlinks, res)
        if kind == "dir":
            class_dirs.append((entry.name, entry.path))
        elif kind == "file":
            top_files.append(entry)
    res.classes = {name: i for i, (name, _) in enumerate(class_dirs)}
    for entry in top_files:
        if class_dirs:
            res.ignored += 1
            res.unclassified += 1
        else:
            res.items.append(Item(entry.path, entry.name, 0.0))
    for label, (name, path) in enumerate(class_dirs):
        _walk(path, name, float(label), root_real, follow_symlinks, seen_dirs, res)
    return res


def _classify(entry: os.DirEntry, root_real: str, follow: bool, res: ScanResult) -> str | None:
    """'dir' to descend, 'file' to pack, None when counted (ignored/rejected) already."""
    rel_hint = entry.name
    if entry.name.startswith("."):
        res.found += 1
        res.ignored += 1
        return None
    try:
        is_link = entry.is_symlink()
        if not is_link:
            if entry.is_dir(follow_symlinks=False):
                return "dir"
            res.found += 1
            mode = entry.stat(follow_symlinks=False).st_mode
            if not is_image_name(entry.name):
                res.ignored += 1
                return None
            if not stat.S_ISREG(mode):
                res.rejects.append((rel_hint, "not_a_file", "not a regular file"))
                return None
            return "file"
    except OSError as e:
        res.found += 1
        res.rejects.append((rel_hint, "unreadable", e.strerror or str(e)))
        return None
    # a symlink
    try:
        target_st = os.stat(entry.path)
    except OSError as e:
        res.found += 1
        res.rejects.append((rel_hint, "broken_link", f"{os.readlink(entry.path)!r}: {e.strerror}"))
        return None
    if stat.S_ISDIR(target_st.st_mode):
        if follow:
            return "dir"
        res.found += 1
        res.ignored += 1
        res.ignored_links += 1
        return None
    res.found += 1
    if not is_image_name(entry.name):
        res.ignored += 1
        return None
    if not stat.S_ISREG(target_st.st_mode):
        res.rejects.append((rel_hint, "not_a_file", "link to something that is not a regular file"))
        return None
    if not follow and not inside(os.path.realpath(entry.path), root_real):
        res.rejects.append((rel_hint, "outside_root", f"link to {os.readlink(entry.path)!r}"))
        return None
    return "file"


def _walk(
    top: str,
    top_rel: str,
    label: float,
    root_real: str,
    follow: bool,
    seen_dirs: set[tuple[int, int]],
    res: ScanResult,
) -> None:
    stack = [(top, top_rel)]
    while stack:
        path, rel = stack.pop()
        try:
            st = os.stat(path)
            key = (st.st_dev, st.st_ino)
            if key in seen_dirs:
                continue
            seen_dirs.add(key)
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as e:
            res.found += 1
            reason = "EACCES" if isinstance(e, PermissionError) else "unreadable"
            res.rejects.append((rel, reason, f"cannot list folder: {e.strerror or e}"))
            continue
        subdirs = []
        for entry in entries:
            before = len(res.rejects)
            kind = _classify(entry, root_real, follow, res)
            erel = f"{rel}/{entry.name}"
            if len(res.rejects) > before:  # name the whole relative path
                _, reason, detail = res.rejects[-1]
                res.rejects[-1] = (erel, reason, detail)
            if kind == "dir":
                subdirs.append((entry.path, erel))
            elif kind == "file":
                res.items.append(Item(entry.path, erel, label))
        stack.extend(reversed(subdirs))  # depth first, sorted
