"""List what to pack: an image folder (one class per top-level subfolder) or an im2rec ``.lst``.

The listing is taken once, at the start (a snapshot); files that change afterwards are dealt
with when they are read. Names are kept as ``str`` with ``surrogateescape`` for bytes that are
not UTF-8 (``os.fsencode`` gives the exact bytes back), and they never go into a
tab-separated file unescaped (see :func:`escape_name`).

Folder rules:

- Classes are the top-level subfolders, numbered in sorted (code point) order from 0; an empty
  class folder keeps its number. Images in deeper folders belong to their top-level class.
- Files directly under the root get label 0 when the root has no class folders, and are
  ignored otherwise.
- Extension allow-list (case-insensitive): ``.jpg .jpeg .png .bmp .webp .tif .tiff``; other
  files are counted as ignored. Content is checked by magic bytes later, not by extension.
- Symlinks: with ``follow_symlinks=False`` (default) a link to a file inside the root is packed,
  a link that leads outside the root is rejected ``outside_root``, a dangling link (or a
  loop) ``broken_link``, and a link to a folder is not followed (counted as ignored). With
  ``follow_symlinks=True`` links are followed anywhere; each folder is entered once (by
  device and inode), so loops end.
- Anything that is not a regular file (FIFO, socket, device) is rejected ``not_a_file``:
  reading one could block forever.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from stoker._core.errors import PackError

__all__ = [
    "IMAGE_EXTENSIONS",
    "Item",
    "ScanResult",
    "escape_name",
    "read_lst",
    "scan_folder",
    "unescape_name",
]

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"})


@dataclass(frozen=True)
class Item:
    """One file to pack: its path, its path relative to the root, and its label."""

    path: str
    rel: str
    label: float | tuple[float, ...]
    key: int | None = None  # from a .lst index; None for folders (key = position)


@dataclass
class ScanResult:
    items: list[Item]
    classes: dict[str, int]
    found: int = 0
    ignored: int = 0
    rejects: list[tuple[str, str, str]] = field(default_factory=list)  # (rel, reason, detail)
    ignored_links: int = 0
    unclassified: int = 0


def escape_name(name: str) -> str:
    r"""A name made safe for one field of a tab-separated line.

    Backslash, tab, newline and carriage return become ``\\``, ``\t``, ``\n``, ``\r``; bytes
    that are not UTF-8 become ``\xNN``. :func:`unescape_name` reverses it exactly.
    """
    out = []
    for ch in name:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif 0xDC80 <= o <= 0xDCFF:  # surrogateescape'd byte
            out.append(f"\\x{o - 0xDC00:02x}")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)


def unescape_name(text: str) -> str:
    """Inverse of :func:`escape_name`."""
    out = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch != "\\" or i + 1 >= n:
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt in "\\tnr":
            out.append({"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}[nxt])
            i += 2
        elif nxt == "x":
            out.append(chr(0xDC00 + int(text[i + 2 : i + 4], 16)))
            i += 4
        elif nxt == "u":
            out.append(chr(int(text[i + 2 : i + 6], 16)))
            i += 6
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _ext_ok(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _inside(path: str, root_real: str) -> bool:
    return path == root_real or path.startswith(root_real.rstrip(os.sep) + os.sep)


def scan_folder(root: str | os.PathLike[str], *, follow_symlinks: bool = False) -> ScanResult:
    """List the images under ``root`` in a fixed order (class, then sorted path)."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise PackError(f"{root}: not a folder (give an image folder or an im2rec .lst file)")
    root_real = os.path.realpath(root)
    res = ScanResult(items=[], classes={})
    seen_dirs: set[tuple[int, int]] = set()
    st = os.stat(root)
    seen_dirs.add((st.st_dev, st.st_ino))

    top_files: list[os.DirEntry] = []
    class_dirs: list[tuple[str, str]] = []  # (name, path)
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as e:
        raise PackError(f"{root}: cannot list the folder: {e.strerror or e}") from None
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
    try:
        is_link = entry.is_symlink()
        if not is_link:
            if entry.is_dir(follow_symlinks=False):
                return "dir"
            res.found += 1
            mode = entry.stat(follow_symlinks=False).st_mode
            if not _ext_ok(entry.name):
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
    if not _ext_ok(entry.name):
        res.ignored += 1
        return None
    if not stat.S_ISREG(target_st.st_mode):
        res.rejects.append((rel_hint, "not_a_file", "link to something that is not a regular file"))
        return None
    if not follow and not _inside(os.path.realpath(entry.path), root_real):
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


def read_lst(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> ScanResult:
    """Parse an im2rec list: ``index \\t label [\\t label ...] \\t relative/path`` per line.

    Paths are relative to ``root`` (default: the folder holding the list). The index becomes
    the record key, as im2rec does; it must be a unique integer >= 0.
    """
    path = os.fspath(path)
    base = os.fspath(root) if root is not None else os.path.dirname(os.path.abspath(path))
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise PackError(f"{path}: cannot read the list: {e.strerror or e}") from None
    res = ScanResult(items=[], classes={})
    seen: set[int] = set()
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        line = line.rstrip(b"\r")
        if not line.strip():
            continue
        fields = line.split(b"\t")
        if len(fields) < 3:
            raise PackError(
                f"{path}, line {lineno}: expected 'index<TAB>label<TAB>path', got {len(fields)} field(s)"
            )
        try:
            key = int(fields[0])
            labels = tuple(float(x) for x in fields[1:-1])
        except ValueError:
            raise PackError(
                f"{path}, line {lineno}: index must be an integer and labels numbers"
            ) from None
        if key < 0:
            raise PackError(f"{path}, line {lineno}: negative index {key}")
        if key in seen:
            raise PackError(f"{path}, line {lineno}: index {key} appears twice")
        seen.add(key)
        rel = os.fsdecode(fields[-1])
        res.found += 1
        label: float | tuple[float, ...] = labels[0] if len(labels) == 1 else labels
        res.items.append(Item(os.path.join(base, rel), rel, label, key))
    return res
