"""List what to pack: an image folder (one class per top-level subfolder) or an im2rec ``.lst``.

The listing is taken once, at the start (a snapshot); files that change afterwards are dealt
with when they are read. Names are kept as ``str`` with ``surrogateescape`` for bytes that are
not UTF-8 (``os.fsencode`` gives the exact bytes back), and they never go into a
tab-separated file unescaped (see :func:`escape_name`).

Folder rules (classes, order, hidden names, extensions, symlinks) are those of
:mod:`stoker._core.files`, the one walk every room uses.
"""

from __future__ import annotations

import math
import os
import stat

from stoker._core import files
from stoker._core.errors import PackError
from stoker._core.files import IMAGE_EXTENSIONS, Item, ScanResult

__all__ = [
    "IMAGE_EXTENSIONS",
    "Item",
    "ScanResult",
    "escape_name",
    "read_lst",
    "scan_folder",
    "unescape_name",
]


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


def scan_folder(root: str | os.PathLike[str], *, follow_symlinks: bool = False) -> ScanResult:
    """List the images under ``root`` in a fixed order (see :mod:`stoker._core.files`)."""
    try:
        return files.scan_folder(root, follow_symlinks=follow_symlinks)
    except NotADirectoryError:
        raise PackError(
            f"{os.fspath(root)}: not a folder (give an image folder or an im2rec .lst file)"
        ) from None
    except OSError as e:
        raise PackError(str(e)) from None


class _Confine:
    """Where list entries may lead: anywhere, as written, unless the user gave a ``root``; then
    inside it (after symlinks), unless ``allow_outside_root``."""

    def __init__(self, base: str, root: object, allow_outside: bool) -> None:
        self.base, self.base_real = base, os.path.realpath(base)
        self.allow_outside = allow_outside or root is None
        self.dirs: dict[str, str] = {}  # folder -> its real path (lists repeat folders a lot)

    def reject(self, rel: str, full: str) -> tuple[str, str] | None:
        """``(reason, detail)`` when the entry must not be read, else None (read it)."""
        if "\x00" in rel:  # no file name holds one; the OS refuses such a path outright
            return "bad_path", f"the path {rel!r} holds a NUL character"
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            return "missing", "listed, but no such file"
        except OSError:
            return None  # the worker's read reports it (EACCES, ENOTDIR, ...)
        is_link = stat.S_ISLNK(st.st_mode)
        if is_link and not os.path.exists(full):
            return "broken_link", f"link to {os.readlink(full)!r} leads nowhere"
        if self.allow_outside:
            return None
        if is_link:
            real = os.path.realpath(full)
        else:
            folder, name = os.path.split(full)
            real_dir = self.dirs.get(folder)
            if real_dir is None:
                real_dir = self.dirs[folder] = os.path.realpath(folder)
            real = os.path.join(real_dir, name)
        if not files.inside(real, self.base_real):
            return "outside_root", (
                f"leads to {real!r}, outside root={self.base!r} (--root); pass "
                "allow_outside_root=True (--allow-outside-root) to pack it"
            )
        return None


def read_lst(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    allow_outside_root: bool = False,
) -> ScanResult:
    """Parse an im2rec list: ``index \\t label [\\t label ...] \\t path`` per line.

    A path is read as written: an absolute one as is, a relative one from ``root`` (default:
    the folder holding the list). The index becomes the record key, as im2rec does; it must be
    a unique integer >= 0.

    Each entry is looked at once, here: one that does not exist is rejected ``missing``, a
    dangling link ``broken_link``, and, when ``root`` is given and not ``allow_outside_root``,
    one that leads outside it (absolute, ``..``, or a symlink) ``outside_root``. These are listed in the rejects file with an empty key, as a folder's
    listing rejects are.
    """
    path = os.fspath(path)
    base = os.fspath(root) if root is not None else os.path.dirname(os.path.abspath(path))
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise PackError(f"{path}: cannot read the list: {e.strerror or e}") from None
    res = ScanResult(items=[], classes={})
    confine = _Confine(base, root, allow_outside_root)
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
        if not all(math.isfinite(x) for x in labels):
            res.rejects.append(
                (rel, "bad_field", f"line {lineno}, field 'label': {labels} is not finite")
            )
            continue
        label: float | tuple[float, ...] = labels[0] if len(labels) == 1 else labels
        full = os.path.join(base, rel)
        why = confine.reject(rel, full)
        if why is not None:
            res.rejects.append((rel, *why))
            continue
        res.items.append(Item(full, rel, label, key))
    return res
