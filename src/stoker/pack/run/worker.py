"""What a worker process does: read each file of a chunk, check it, and send back the bytes to
store or the reason it is rejected.

Only small frozen objects cross the process boundary: a :class:`Task` (paths and the run's
:class:`~stoker.pack.plan.options.PackOptions`) in, a list of plain tuples out, one per path:
``(0, payload, source_format, rotated, passthrough, bytes_read)`` for a file to store
(a listing's row with masks adds a seventh item, ``{field: mask PNG bytes}``),
``(1, reason, detail)`` for a reject.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from typing import Any

from stoker.pack._procs import worker_init
from stoker.pack.images import Reject
from stoker.pack.plan.options import PackOptions

__all__ = ["MAX_FILE_BYTES", "Task", "init_worker", "process", "process_task"]

#: RecordIO's record limit (2^29-1 bytes) less the record header and room for 64 labels.
MAX_FILE_BYTES = (1 << 29) - 1 - 24 - 4 * 64


@dataclass(frozen=True)
class Task:
    """A chunk of files for one worker, and the options to check them with."""

    paths: tuple[str, ...]
    options: PackOptions
    #: per path, the ``(field, path)`` of each mask to read with it (a listing's rows)
    masks: tuple[tuple[tuple[str, str], ...], ...] = ()
    #: reject an image that an EXIF orientation would turn (its boxes, points or masks were
    #: drawn on the stored pixels, which a turn would move from under them)
    upright: bool = False


def init_worker(main_pid: int) -> None:
    """Worker start: Ctrl-C is the main process's business; exit when it dies (``_procs``)."""
    worker_init(main_pid)
    from PIL import Image, ImageFile

    Image.MAX_IMAGE_PIXELS = None  # check_image applies max_pixels from the header itself
    ImageFile.LOAD_TRUNCATED_IMAGES = False


def _unreadable(e: OSError) -> Reject:
    return Reject("unreadable", f"{errno.errorcode.get(e.errno or 0, e.errno)}: {e.strerror}")


def _read_file(path: str) -> bytes:
    """The whole file; a reject when it is gone, not a regular file, too large or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Reject("vanished", "no longer exists (removed after the listing)") from None
    except PermissionError as e:
        raise Reject("EACCES", e.strerror or "permission denied") from None
    except OSError as e:
        raise _unreadable(e) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Reject("not_a_file", "not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise Reject(
                "too_large", f"{st.st_size} bytes; a RecordIO record holds at most 2^29-1 bytes"
            )
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            return f.read()
    except Reject:
        raise
    except OSError as e:
        raise _unreadable(e) from None
    finally:
        if fd >= 0:
            os.close(fd)


def process(
    path: str,
    options: PackOptions,
    masks: tuple[tuple[str, str], ...] = (),
    *,
    upright: bool = False,
) -> tuple:
    """One file's result tuple (see the module docstring); never raises for a bad file."""
    check = options.check
    assert check is not None  # PackOptions puts check_image in place of None
    try:
        data = _read_file(path)
        got = check(
            data, max_pixels=options.max_pixels, resize=options.resize, quality=options.quality
        )
        if upright and got.rotated:
            raise Reject(
                "exif_rotated",
                "an EXIF orientation turns this image, and its boxes, points or masks would "
                "no longer lie on it; store the pixels upright (or drop the tag)",
            )
        mask_bytes = {name: _mask(name, p, got, options) for name, p in masks}
    except Reject as r:
        return (1, r.reason, r.detail)
    except MemoryError:
        return (1, "out_of_memory", "decoding ran out of memory")
    except Exception as e:  # noqa: BLE001 - one bad file must not stop the run
        return (1, "undecodable", f"{type(e).__name__}: {e}")
    out = (0, got.payload, got.source_format, got.rotated, got.passthrough, len(data))
    return (*out, mask_bytes) if masks else out


def _mask(name: str, path: str, image: Any, options: PackOptions) -> bytes:
    """A mask file's bytes, checked: a palette or grey PNG the size of its image."""
    from stoker._core.errors import ImageDecodeError
    from stoker.codecs import decode_mask

    try:
        data = _read_file(path)
    except Reject as r:
        raise Reject(f"mask_{r.reason}", f"field {name!r}, {path}: {r.detail}") from None
    try:
        shape = decode_mask(data, max_pixels=options.max_pixels).shape
    except ImageDecodeError as e:
        raise Reject("bad_mask", f"field {name!r}, {path}: {e}") from None
    if shape != (image.height, image.width):
        raise Reject(
            "mask_size",
            f"field {name!r}, {path}: the mask is {shape[1]}x{shape[0]}, the image "
            f"{image.width}x{image.height} (width x height)",
        )
    return data


def process_task(task: Task) -> list[tuple]:
    """The result tuples of a chunk, in its order (what the pool runs)."""
    masks = task.masks or ((),) * len(task.paths)
    return [
        process(p, task.options, m, upright=task.upright)
        for p, m in zip(task.paths, masks, strict=True)
    ]
