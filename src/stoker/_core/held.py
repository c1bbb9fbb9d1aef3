"""Files that say a process is alive: a small JSON file that its process holds ``LOCK_EX``
(flock) for as long as what it describes lives (a claim on a shard cache, a loader's ring).
A reader takes ``LOCK_SH | LOCK_NB``: that fails while the holder lives, and succeeds once it
is gone (a flock goes with its process, whatever killed it), when the file is removed."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import Any

from stoker._core.oscompat import OWN_FILE, lock, read_at

__all__ = ["live_bodies"]


def live_bodies(folder: str, on_dead: Callable[[Any], None] | None = None) -> list[Any]:
    """The JSON of every ``*.json`` file in ``folder`` that a live process holds, in name
    order (a file that is not JSON reads as ``None``); the files nobody holds are removed,
    each after ``on_dead(its JSON)`` when given (to free what a dead holder left behind).
    Call it under the lock that guards the folder's writers."""
    out: list[Any] = []
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY | OWN_FILE)
        except OSError:
            continue
        try:
            try:
                lock(fd, shared=True, block=False)
            except BlockingIOError:  # held: its process lives
                try:
                    out.append(json.loads(read_at(fd, 4096, 0)))
                except (OSError, ValueError):
                    out.append(None)
                continue
            if on_dead is not None:
                with contextlib.suppress(OSError, ValueError):
                    on_dead(json.loads(read_at(fd, 4096, 0)))
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        finally:
            os.close(fd)
    return out
