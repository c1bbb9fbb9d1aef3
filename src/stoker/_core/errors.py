"""Stoker's one exception tree.

Every error stoker raises on purpose subclasses :class:`StokerError`, so a caller can
catch them all with one clause. Errors about bad arguments also subclass the builtin a
Python user expects (``ValueError``/``TypeError``), so ``except ValueError`` keeps working.

::

    StokerError
    ├── StokerFormatError (ValueError)        a file on disk is not what it claims to be
    │   ├── CorruptRecordError                 a record in a .rec/.idx pair; names path, key, offset, .idx line
    │   ├── IndexFormatError                   a malformed .idx line; names path and line number
    │   └── ManifestError                      a malformed or mismatched .stoker.json side-car
    ├── ImageDecodeError (ValueError)          bytes that do not decode to an image; names the source
    │   └── ImageTooLargeError                 the header declares more pixels than the limit
    ├── PackError                              `stoker pack` could not finish
    │   └── TooManyRejectsError                rejects exceeded --max-rejects
    ├── OutputExistsError (FileExistsError)    refusing to overwrite without overwrite=True
    ├── SpecError (ValueError)                 declared shapes/dtypes that do not fit together
    ├── IncompatibleStateError (ValueError)    a state_dict from another dataset, seed or version
    ├── StorageError (OSError)                 remote storage failed after its retries; names the URL
    │   │                                      (credentials removed), the shard and the byte range
    │   └── CacheFullError                     the shard cache cannot make room (budget or disk full)
    ├── LoaderError                            the loader's worker side failed
    │   ├── WorkerError                        a worker raised; carries type name, traceback, worker id, key
    │   ├── WorkerDiedError                    a worker process died (signal or exit code)
    │   ├── LoaderTimeoutError (TimeoutError)  no batch within `timeout`
    │   ├── SharedMemoryError (OSError)        /dev/shm too small or an allocation failed
    │   └── TooManyBadSamplesError             on_error="skip" passed its ceiling
    └── CheckResumeError                       check-resume could not run a child to its end (it
                                               failed, stalled or died); names the run
"""

from __future__ import annotations

import math
import os
import re
from typing import TypeVar

_E = TypeVar("_E", bound=BaseException)

__all__ = [
    "CacheFullError",
    "CheckResumeError",
    "ChildTraceback",
    "CorruptRecordError",
    "ImageDecodeError",
    "ImageTooLargeError",
    "IncompatibleStateError",
    "IndexFormatError",
    "LoaderError",
    "LoaderTimeoutError",
    "ManifestError",
    "OutputExistsError",
    "PackError",
    "SharedMemoryError",
    "SpecError",
    "StokerError",
    "StokerFormatError",
    "StorageError",
    "TooManyBadSamplesError",
    "TooManyRejectsError",
    "WorkerDiedError",
    "WorkerError",
]


def located(reason: str, *where: str | tuple[str, object]) -> str:
    """``"PLACE, PLACE: reason"``, the way every error and problem names where it is: each
    place a string, or ``(template, value)`` filled with ``template.format(value)`` and left
    out when the value is ``None`` (not known)."""
    parts = [
        w if isinstance(w, str) else w[0].format(w[1])
        for w in where
        if isinstance(w, str) or w[1] is not None
    ]
    return f"{', '.join(parts)}: {reason}" if parts else reason


class ChildTraceback(Exception):
    """The traceback of an exception raised in a child process (a loader worker, a
    check-resume run), as text: the ``__cause__`` of the error raised for it in the parent,
    so Python prints it above that error while the error's own message stays one line."""

    def __str__(self) -> str:
        return f'\n"""\n{self.args[0]}"""'


def with_child_traceback(err: _E, text: str) -> _E:
    """``err`` with the child's traceback ``text`` as its ``__cause__`` (none when empty)."""
    if text:
        err.__cause__ = ChildTraceback(text)
    return err


def size_text(n: float) -> str:
    """Bytes for a message, in binary units rounded up (so a figure to raise a budget to is
    enough): ``"1.5 GiB"``, ``"320.0 MiB"``, ``"48.2 KiB"``, ``"512 bytes"``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{math.ceil(10 * n / size) / 10:.1f} {unit}"
    return f"{int(n)} bytes"


def without_reprs(text: str) -> str:
    """``text`` without object reprs such as ``<_io.BytesIO object at 0x7f...>`` (Pillow puts
    one in "cannot identify image file"): an address tells a reader nothing."""
    return re.sub(r" ?<[\w.]+ object at 0x[0-9a-fA-F]+>", "", text)


class StokerError(Exception):
    """Base of every error stoker raises on purpose."""


class StokerFormatError(StokerError, ValueError):
    """A file is not in the format it claims to be in."""


class CorruptRecordError(StokerFormatError):
    """A record of a RecordIO file cannot be read.

    The message names the file, the record key (when known), the byte offset and, when the
    offset came from an ``.idx`` file, the line of that file.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        offset: int | None,
        reason: str,
        *,
        key: int | None = None,
        idx_line: int | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.offset = offset
        self.key = key
        self.idx_line = idx_line
        self.reason = reason
        super().__init__(
            located(
                reason,
                self.path,
                ("key {}", key),
                ("byte offset {}", offset),
                (".idx line {}", idx_line),
            )
        )

    def __reduce__(self):  # keep it picklable across worker processes
        return (
            _rebuild_corrupt,
            (self.path, self.offset, self.reason, self.key, self.idx_line),
        )


def _rebuild_corrupt(path, offset, reason, key, idx_line):  # noqa: ANN001
    return CorruptRecordError(path, offset, reason, key=key, idx_line=idx_line)


class IndexFormatError(StokerFormatError):
    """A line of an ``.idx`` file is malformed."""

    def __init__(self, path: str | os.PathLike[str], line: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{self.path}, line {line}: {reason}")

    def __reduce__(self):
        return (IndexFormatError, (self.path, self.line, self.reason))


class ManifestError(StokerFormatError):
    """A ``.stoker.json`` side-car is malformed or does not match its files."""


class ImageDecodeError(StokerError, ValueError):
    """Bytes that should hold an image do not decode to one."""


class ImageTooLargeError(ImageDecodeError):
    """An image whose header declares more pixels than the limit (a decompression bomb);
    refused before any pixel is decoded."""


class PackError(StokerError):
    """``stoker pack`` could not finish."""


class TooManyRejectsError(PackError):
    """More files were rejected than ``max_rejects`` allows, or every file was."""


class OutputExistsError(StokerError, FileExistsError):
    """An output exists and overwriting was not asked for."""


class SpecError(StokerError, ValueError):
    """Declared array shapes or dtypes do not fit together."""


class IncompatibleStateError(StokerError, ValueError):
    """A loader or sampler state that does not belong to this dataset/configuration."""


class StorageError(StokerError, OSError):
    """Remote storage failed after its bounded retries; the message names the URL without
    credentials, the shard and the byte range."""


class CacheFullError(StorageError):
    """The shard cache cannot make room: every cached shard is in use, or the disk is full."""


class LoaderError(StokerError):
    """The loader's worker side failed."""


class WorkerError(LoaderError):
    """An exception raised inside a loader worker, re-raised in the main process.

    ``exc_type`` is the name of the original exception type, ``worker_id`` the worker,
    ``key`` the record key being processed and ``remote_traceback`` the worker's traceback
    text (also the ``__cause__``, :class:`ChildTraceback`; the message is one line). The
    loader raises an instance of a subclass that also derives from the original
    type when it can (so ``except KeyError`` still catches a worker's ``KeyError``).
    """

    def __init__(
        self,
        message: str,
        *,
        exc_type: str = "Exception",
        worker_id: int | None = None,
        key: int | None = None,
        index: int | None = None,
        remote_traceback: str = "",
    ) -> None:
        self.exc_type = exc_type
        self.worker_id = worker_id
        self.key = key
        self.index = index
        self.remote_traceback = remote_traceback
        with_child_traceback(self, remote_traceback)
        super().__init__(message)


class WorkerDiedError(LoaderError):
    """A worker process died: killed by a signal or exited unexpectedly."""


class LoaderTimeoutError(LoaderError, TimeoutError):
    """No batch arrived within the loader's ``timeout``."""


class SharedMemoryError(LoaderError, OSError):
    """Shared memory is too small or could not be allocated."""


class TooManyBadSamplesError(LoaderError):
    """With ``on_error="skip"``, more samples failed than the ceiling allows."""


class CheckResumeError(StokerError):
    """``stoker check-resume`` could not run one of its child runs to its end: the loader
    failed in it (its traceback is in the message), stalled past the timeout, or the child
    died without being killed. A resume that is not exact is a report, not this error."""
