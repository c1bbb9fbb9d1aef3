"""Worker processes from the fork server that do not import the user's main script.

A process started through ``multiprocessing``'s fork server (or spawn) first imports the
parent's ``__main__`` module, so that objects defined there can be unpickled. For a training
script that means every worker runs the script's imports (``import torch``, say) before it
makes its first sample, although a loader worker needs nothing from it unless the transforms
or the source were defined there (docs/loader.md has the cost).

:func:`worker_process` gives a fork-server process that skips that import when the pickled
arguments name nothing in ``__main__``; otherwise (or where the fork server's launch code is
not the one this was written against) an ordinary ``ctx.Process``. The launch below is the
standard library's ``popen_forkserver.Popen._launch`` (docs/loader.md names the Python
versions it matches) with the two ``init_main_*`` keys removed from the preparation data; the
child still gets the parent's ``sys.path``, working directory and process name.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

__all__ = ["SERVER", "names_main", "worker_process"]

_LAUNCH_PARTS: tuple | None
try:  # the fork server's launch machinery (POSIX); internal, so typed loosely here
    import multiprocessing.context as _context
    import multiprocessing.forkserver as _forkserver
    import multiprocessing.popen_forkserver as _popen_forkserver
    import multiprocessing.spawn as _spawn
    import multiprocessing.util as _util

    context: Any = _context
    forkserver: Any = _forkserver
    popen_forkserver: Any = _popen_forkserver
    spawn: Any = _spawn
    util: Any = _util
    _LAUNCH_PARTS = (
        forkserver.ForkServer.connect_to_new_process,
        forkserver.read_signed,
        context.set_spawning_popen,
        context.reduction.dump,
        context.ForkServerProcess,
        popen_forkserver.Popen,
        spawn.get_preparation_data,
        util.Finalize,
        util.close_fds,
    )
except (ImportError, AttributeError):  # pragma: no cover - not on this platform/version
    _LAUNCH_PARTS = None

_MAIN_KEYS = ("init_main_from_path", "init_main_from_name")

#: The loader's own fork server (for the workers that skip ``__main__``), apart from
#: ``multiprocessing``'s one: a server is started once with the modules it preloads, and one
#: that ``stoker pack``, a ``DataLoader`` or any other user of the forkserver context started
#: first would lack stoker's, so every new loader's workers would import them (about 0.3 s
#: of its first batch).
SERVER: Any = forkserver.ForkServer() if _LAUNCH_PARTS is not None else None


def names_main(*objects: Any) -> bool:
    """Whether pickling ``objects`` refers to anything in ``__main__`` (a transform or source
    class defined in the script; in a child that ``multiprocessing`` spawned, the script runs
    as ``__mp_main__``). Unpicklable objects count as yes: the ordinary start then raises the
    error that names them."""
    from stoker.loader._shm import probing

    try:
        with probing():  # shared memory pickles as a placeholder: this pickle is only read
            blob = pickle.dumps(objects, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001
        return True
    return b"__main__" in blob or b"__mp_main__" in blob


if _LAUNCH_PARTS is not None:

    class _LeanPopen(popen_forkserver.Popen):  # type: ignore[misc]
        def _launch(self, process_obj: Any) -> None:
            prep_data = spawn.get_preparation_data(process_obj._name)
            for key in _MAIN_KEYS:
                prep_data.pop(key, None)
            buf = io.BytesIO()
            context.set_spawning_popen(self)
            try:
                context.reduction.dump(prep_data, buf)
                context.reduction.dump(process_obj, buf)
            finally:
                context.set_spawning_popen(None)
            self.sentinel, w = SERVER.connect_to_new_process(self._fds)
            # as the standard library does: a duplicate of the data pipe's write end is the
            # child's sentinel of this process
            parent_w = os.dup(w)
            self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)

    class _LeanProcess(context.ForkServerProcess):  # type: ignore[misc]
        @staticmethod
        def _Popen(process_obj: Any) -> Any:  # noqa: N802 - the standard library's name
            return _LeanPopen(process_obj)


def worker_process(ctx: Any, *, target: Any, args: tuple, name: str, data: tuple) -> Any:
    """A daemon process of ``ctx`` running ``target(*args)``, started without importing
    ``__main__`` when neither ``target`` nor ``data`` (the arguments that are plain data, not
    pipes) names anything there (see the module docstring)."""
    lean = (
        _LAUNCH_PARTS is not None
        and ctx.get_start_method() == "forkserver"
        and not names_main(target, *data)
    )
    cls = _LeanProcess if lean else ctx.Process
    return cls(target=target, args=args, name=name, daemon=True)
