"""Atomic file output: write ``NAME.partial``, fsync, then rename over ``NAME``.

A reader never sees a half-written file under its final name, and a process killed midway
leaves only ``*.partial`` files behind (which the next run removes or resumes from).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO

__all__ = [
    "PARTIAL_SUFFIX",
    "atomic_write",
    "fsync_dir",
    "partial_path",
    "write_bytes_atomic",
    "write_cache_file",
]

PARTIAL_SUFFIX = ".partial"


def partial_path(path: str | os.PathLike[str]) -> str:
    return os.fspath(path) + PARTIAL_SUFFIX


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that a rename inside it survives a crash."""
    try:
        fd = os.open(os.fspath(path) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "wb", *, shared: bool = False
) -> Iterator[IO]:
    """Open ``path + '.partial'`` for writing; on success fsync and rename it to ``path``.

    On any exception the partial file is removed and the exception propagates; ``path``
    keeps whatever it held before. ``shared``: several processes may write the same content
    to ``path`` at once (a cache entry named by its content); each writes a partial of its
    own (``path.PID.RAND.partial``) and the last rename wins.
    """
    if "w" not in mode:
        raise ValueError(f"atomic_write needs a write mode, got {mode!r}")
    final = os.fspath(path)
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(
                f"{final} exists and is not a regular file; refusing to replace it atomically"
            )
    tmp = partial_path(final)
    if shared:
        tmp = f"{final}.{os.getpid()}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}"
    f = open(tmp, mode)  # noqa: SIM115
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        os.replace(tmp, final)
        fsync_dir(os.path.dirname(os.path.abspath(final)))
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_write(path, "wb") as f:
        f.write(data)


def write_cache_file(path: str | os.PathLike[str], chunks: Iterable[bytes]) -> bool:
    """Best-effort write of a derived cache file: a unique temporary name (processes opening
    the same dataset at once may all write it), fsync, chmod 644, rename. Returns False, with
    nothing left behind, when the folder is read-only or a write fails: a cache is optional."""
    final = os.fspath(path)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=os.path.basename(final) + ".",
            suffix=PARTIAL_SUFFIX,
            dir=os.path.dirname(os.path.abspath(final)),
        )
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, final)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True
