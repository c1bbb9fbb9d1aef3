"""Worker-process set-up shared by the packer and the sample-data maker.

Pools run on multiprocessing's forkserver. The forkserver keeps running as long as any
process it forked holds its "alive" pipe, and every worker holds it, so a worker cannot rely on
its parent (the forkserver) dying when the main process is killed. Each worker therefore
watches the main process itself (a pidfd, or polling where pidfds do not exist) and exits when
it is gone; then the forkserver sees its pipe close and exits too.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time

__all__ = ["pool_context", "worker_init"]


def pool_context():
    import multiprocessing

    return multiprocessing.get_context("forkserver")


def _watch(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        select.select([fd], [], [])  # readable once the process has exited
        os._exit(1)
    while True:
        time.sleep(0.5)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:
            pass


def worker_init(main_pid: int) -> None:
    """Leave Ctrl-C to the main process and exit when it dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(
        target=_watch, args=(main_pid,), name="stoker-parent-watch", daemon=True
    ).start()
