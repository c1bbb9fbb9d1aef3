"""Worker processes (from the fork server, or spawned) that do not import the user's main script.

A process started through ``multiprocessing``'s fork server (or spawn) first imports the
parent's ``__main__`` module, so that objects defined there can be unpickled. For a training
script that means every worker runs the script's imports (``import torch``, say) before it
makes its first sample, although a loader worker needs nothing from it unless the transforms
or the source were defined there (docs/loader.md has the cost).

:func:`worker_process` gives a fork-server or a spawned (POSIX) process that skips that import
when the pickled arguments name nothing in ``__main__``; otherwise (or on Windows, or where
the launch code is not the one this was written against) an ordinary ``ctx.Process``. The
launches below are the standard library's ``popen_forkserver.Popen._launch`` and
``popen_spawn_posix.Popen._launch`` (the same in Python 3.10 to 3.13) with the two
``init_main_*`` keys removed from the preparation data; the child still gets the parent's
``sys.path``, working directory and process name.
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

_SPAWN_PARTS: tuple | None
try:  # spawn's launch on POSIX (macOS's default start method; the portable engine's)
    import multiprocessing.popen_spawn_posix as _popen_spawn_posix
    import multiprocessing.resource_tracker as _resource_tracker

    popen_spawn_posix: Any = _popen_spawn_posix
    resource_tracker: Any = _resource_tracker
    _SPAWN_PARTS = (
        popen_spawn_posix.Popen,
        resource_tracker.getfd,
        _spawn.get_command_line,
        _spawn.get_executable,
        _util.spawnv_passfds,
        _context.SpawnProcess,
    )
except (ImportError, AttributeError, NameError):  # Windows: no popen_spawn_posix
    _SPAWN_PARTS = None

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


def _lean_preparation(name: str) -> dict:
    """What a child gets to prepare itself (``sys.path``, working directory, ...), without
    the keys that make it import ``__main__``."""
    prep_data = spawn.get_preparation_data(name)
    for key in _MAIN_KEYS:
        prep_data.pop(key, None)
    return prep_data


def _lean_pickle(popen: Any, process_obj: Any) -> io.BytesIO:
    """What the child reads from its pipe: the lean preparation data, then the process
    object, pickled while ``popen`` is the process being started (its descriptors go along)."""
    buf = io.BytesIO()
    context.set_spawning_popen(popen)
    try:
        context.reduction.dump(_lean_preparation(process_obj._name), buf)
        context.reduction.dump(process_obj, buf)
    finally:
        context.set_spawning_popen(None)
    return buf


_LEAN: dict[str, Any] = {}  # start method -> the process class that skips __main__

if _LAUNCH_PARTS is not None:

    class _LeanPopen(popen_forkserver.Popen):  # type: ignore[misc]
        def _launch(self, process_obj: Any) -> None:
            buf = _lean_pickle(self, process_obj)
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

    _LEAN["forkserver"] = _LeanProcess


if _SPAWN_PARTS is not None:

    class _LeanSpawnPopen(popen_spawn_posix.Popen):  # type: ignore[misc]
        def _launch(self, process_obj: Any) -> None:
            tracker_fd = resource_tracker.getfd()
            self._fds.append(tracker_fd)
            buf = _lean_pickle(self, process_obj)
            parent_r = child_w = child_r = parent_w = None
            try:
                parent_r, child_w = os.pipe()
                child_r, parent_w = os.pipe()
                cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
                self._fds.extend([child_r, child_w])
                self.pid = util.spawnv_passfds(spawn.get_executable(), cmd, self._fds)
                self.sentinel = parent_r
                with open(parent_w, "wb", closefd=False) as f:
                    f.write(buf.getbuffer())
            finally:
                mine = [fd for fd in (parent_r, parent_w) if fd is not None]
                self.finalizer = util.Finalize(self, util.close_fds, mine)
                for fd in (child_r, child_w):
                    if fd is not None:
                        os.close(fd)

    class _LeanSpawnProcess(context.SpawnProcess):  # type: ignore[misc]
        @staticmethod
        def _Popen(process_obj: Any) -> Any:  # noqa: N802 - the standard library's name
            return _LeanSpawnPopen(process_obj)

    _LEAN["spawn"] = _LeanSpawnProcess


def worker_process(ctx: Any, *, target: Any, args: tuple, name: str, data: tuple) -> Any:
    """A daemon process of ``ctx`` running ``target(*args)``, started without importing
    ``__main__`` when neither ``target`` nor ``data`` (the arguments that are plain data, not
    pipes) names anything there (see the module docstring)."""
    cls = _LEAN.get(ctx.get_start_method())
    if cls is None or names_main(target, *data):
        cls = ctx.Process
    return cls(target=target, args=args, name=name, daemon=True)
