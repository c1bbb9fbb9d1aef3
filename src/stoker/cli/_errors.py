"""How a command reports an error: one line on stderr, ``stoker COMMAND: error: WHAT``, that
names the argument and says what to do; never an errno, a traceback or the usage (that is
what ``--help`` is for).

:func:`error_text` words an exception: an :class:`OSError` of the file system becomes the
argument it came from (``DIR data/train.rec``), what is wrong in plain words (a file where a
folder is expected, no such file or folder, ...) and what to do; anything else keeps its own
message, with any ``[Errno N]`` taken out. :func:`input_problem` words the usual wrong inputs
of a command that reads a set (a missing path, an image folder or a listing not yet packed,
one image file, a file of no format stoker reads) before anything opens them; :func:`refuse`
prints such a line.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys

__all__ = [
    "argument_label",
    "error_text",
    "folder_problem",
    "input_problem",
    "pack_source_problem",
    "refuse",
]

_ERRNO = re.compile(r"\[Errno -?\d+\]\s*")

#: errno -> (what is wrong, put after the path; what to do)
_OS_WORDS: dict[int, tuple[str, str]] = {
    errno.ENOENT: (": no such file or folder", "check the path"),
    errno.EISDIR: (" is a folder where a file is expected", "give a file"),
    errno.ENOTDIR: (" is a file where a folder is expected", "give a folder (or remove the file)"),
    errno.EACCES: (": permission denied", "check its permissions or choose another path"),
    errno.EPERM: (": operation not permitted", "check its permissions or choose another path"),
    errno.ENOSPC: (": no space left on the device", "free some space or write elsewhere"),
    errno.EROFS: (": on a read-only file system", "write elsewhere"),
    errno.ENAMETOOLONG: (": the name is too long", "choose a shorter path"),
    errno.ENOTEMPTY: (": the folder is not empty", "choose an empty or new folder"),
}


def refuse(command: str, text: object, status: int = 2) -> int:
    """Print ``stoker COMMAND: error: TEXT`` on stderr; returns ``status``, the exit status."""
    print(f"stoker {command}: error: {text}", file=sys.stderr)
    return status


def argument_label(args: argparse.Namespace, dest: str) -> str:
    """How ``stoker COMMAND --help`` names the argument stored in ``dest``: a positional by
    its metavar (``SRC``), an option by its long flag (``--list``); ``dest`` upper-cased when
    the command has no such argument. The command's parser travels in ``args`` (each command's
    defaults name it, see ``stoker.cli.build_parser``)."""
    sub = getattr(args, "command_parser", None)
    for action in sub._actions if sub is not None else ():
        if action.dest != dest:
            continue
        if action.option_strings:
            return max(action.option_strings, key=len)
        return str(action.metavar or action.dest.upper())
    return dest.upper()


def _named(path: str, args: argparse.Namespace) -> str:
    """``path`` with the argument it came from: ``DIR out`` when it is the argument's value,
    ``OUT data/train: data/train.rec`` when it lies under the value, starts with it (an OUT
    prefix) or holds it (a file in the way of a folder to make); ``path`` alone when no
    argument is near it."""
    target = os.path.abspath(path)
    best: tuple[int, str, str] | None = None
    for dest, value in vars(args).items():
        if not isinstance(value, (str, os.PathLike)) or dest in ("command", "func"):
            continue
        text = os.fspath(value)
        given = os.path.abspath(text)
        if target == given:
            rank = 3
        elif target.startswith(given.rstrip(os.sep) + os.sep):
            rank = 2
        elif given.startswith(target.rstrip(os.sep) + os.sep) or (
            os.path.dirname(target) == os.path.dirname(given)
            and os.path.basename(target).startswith(os.path.basename(given) + ".")
        ):
            rank = 1
        else:
            continue
        if best is None or rank > best[0]:
            best = (rank, dest, text)
    if best is None:
        return path
    label = argument_label(args, best[1])
    return f"{label} {path}" if best[0] == 3 else f"{label} {best[2]}: {path}"


def _file_in_the_way(path: str) -> str:
    """The part of ``path`` that is a file although the rest needs it to be a folder."""
    p = path
    while p and not os.path.isfile(p):
        parent = os.path.dirname(p)
        if parent == p:
            return path
        p = parent
    return p or path


def _os_error_text(e: OSError, args: argparse.Namespace) -> str:
    path = os.fsdecode(e.filename) if e.filename is not None else None
    words = _OS_WORDS.get(e.errno or 0)
    if path is None or (words is None and e.errno != errno.EEXIST):
        text = _ERRNO.sub("", str(e))
        return text if path is None or path in text else f"{path}: {text}"
    if words is None:  # EEXIST
        what, todo = ": already exists", "choose another path"
        if getattr(args, "overwrite", None) is False:
            todo = "pass --overwrite to replace it, or choose another path"
    else:
        if e.errno == errno.ENOTDIR:  # a file where a folder is to be made or read
            path = _file_in_the_way(path)
        what, todo = words
    return f"{_named(path, args)}{what}; {todo}"


def error_text(e: BaseException, args: argparse.Namespace) -> str:
    """The one line (without the ``stoker COMMAND: error:`` prefix) that reports ``e``. The
    library's words for an option name the command's flag: ``pass overwrite=True`` becomes
    ``pass --overwrite``, ``batch_size must be >= 1`` becomes ``--batch-size must be >= 1``."""
    from stoker._core.errors import StokerError

    if isinstance(e, OSError) and not isinstance(e, StokerError):
        return _os_error_text(e, args)
    text = " ".join(_ERRNO.sub("", str(e)).split()) or type(e).__name__

    def flag(m: re.Match[str]) -> str:
        name = "--" + m.group(1).replace("_", "-")
        return f"pass {name}" if argument_label(args, m.group(1)) == name else m.group(0)

    text = _API_TRUE.sub(flag, text)
    m = _API_NAME.match(text)
    if m is not None:
        name = argument_label(args, m.group(1))
        if name.startswith("--"):
            text = name + text[m.end(1) :]
    return text


#: a message that opens with the keyword it is about (``workers must be >= 1, got 0``)
_API_NAME = re.compile(r"(\w+) must ")
#: the library's advice to pass a keyword as True, with the flag it may already name after it
_API_TRUE = re.compile(r"pass (\w+)=True(?: \(--[\w-]+\))?")


def input_problem(
    path: str,
    label: str,
    *,
    folders: bool = False,
    detect: bool = True,
    format_option: str | None = "--format",
) -> str | None:
    """What is wrong with ``path`` as the set a command reads (``label``: how the command
    names the argument), or ``None`` when stoker can try to open it. ``folders``: an image
    folder is a fine input (``stoker doctor``); ``detect``: also check that its format can be
    told from its name (not when the format is given); ``format_option``: the command's option
    that names a format, if it has one."""
    from stoker._core.files import is_image_name
    from stoker.formats import registry
    from stoker.formats.registry import MANIFEST_SUFFIX
    from stoker.pack.plan.listing import LISTING_SUFFIXES

    pack_first = f"pack it first: stoker pack {path} OUT, then give OUT{MANIFEST_SUFFIX}"
    if "://" in path:
        return None
    if not os.path.lexists(path):
        return f"{label} {path}: no such file or folder; check the path"
    low = path.lower()
    if os.path.isfile(path) and low.endswith((*LISTING_SUFFIXES, ".lst")):
        return f"{label} {path} is a listing, not a packed set; {pack_first}"
    if os.path.isfile(path) and is_image_name(path):
        return (
            f"{label} {path} is one image, not a set; give a packed set "
            f"(NAME{MANIFEST_SUFFIX}, a .rec, .tfrecord or .tar) or pack a folder of images "
            "first: stoker pack DIR OUT"
        )
    if os.path.isdir(path) and folders:
        return None
    if os.path.isdir(path) and _holds_images(path):
        return f"{label} {path} is an image folder, not a packed set; {pack_first}"
    if not detect:
        return None
    try:
        registry.format_of(path)
    except ValueError as e:
        from stoker._core.errors import StokerError

        if isinstance(e, StokerError):
            return None  # a bad manifest: opening it says what is wrong
        known = ", ".join(x for f in registry.FORMATS.values() for x in f.extensions)
        todo = (
            f"name its format with {format_option} ({', '.join(registry.FORMATS)})"
            if format_option
            else "give a NAME.stoker.json manifest or rename the file to its format's extension"
        )
        return (
            f"{label} {path}: cannot tell its format (stoker reads a NAME{MANIFEST_SUFFIX} "
            f"manifest, a file ending in {known}, or an LMDB folder); {todo}"
        )
    except OSError:
        return None  # unreadable: opening it says why
    return None


def _holds_images(root: str) -> bool:
    """Whether ``root`` or one of its subfolders (one level down) holds an image file."""
    from stoker._core.files import is_image_name

    try:
        with os.scandir(root) as top:
            entries = list(top)
        if any(e.is_file() and is_image_name(e.name) for e in entries):
            return True
        for d in entries:
            if d.is_dir():
                with os.scandir(d.path) as inner:
                    if any(e.is_file() and is_image_name(e.name) for e in inner):
                        return True
    except OSError:
        return False
    return False


def pack_source_problem(path: str, label: str = "SRC") -> str | None:
    """What is wrong with ``path`` as the source of ``stoker pack`` (an image folder, an
    im2rec ``.lst`` or a ``.jsonl``/``.csv`` listing), or ``None`` when it may be one."""
    from stoker.formats import registry

    if "://" in path:
        return None
    if not os.path.lexists(path):
        return f"{label} {path}: no such file or folder; check the path"
    if os.path.isdir(path):
        return None
    try:
        fmt = registry.format_of(path)
    except (ValueError, OSError):
        return None
    return (
        f"{label} {path} is a packed set ({fmt.name}); pack reads an image folder, an im2rec "
        f".lst or a .jsonl/.csv listing; to write a set in another format: stoker convert "
        f"{path} OUT --format NAME"
    )


def folder_problem(path: str, label: str) -> str | None:
    """What is wrong with ``path`` as a folder a command writes into (made when missing): a
    file at ``path`` or at one of its parents; ``None`` when it can be a folder."""
    if "://" in path:
        return None
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    if not os.path.isfile(p):
        return None
    todo = "give a folder (it is made when missing)"
    if p == os.path.abspath(path):
        return f"{label} {path} is a file where a folder is expected; {todo}"
    return f"{label} {path}: {p} is a file where a folder is expected; {todo}"
