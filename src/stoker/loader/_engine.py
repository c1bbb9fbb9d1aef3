"""The loader's engine: the one place that chooses how workers start, what their batch ring is
and how they learn that the main process is gone. The rest of the loader (the ring protocol
in ``_feed.py``, the pool in ``_pool.py``, the worker loop in ``_worker.py``) is the same for
both.

==============  ======================================  =====================================
                ``"linux"`` (the default on Linux)       ``"portable"`` (anywhere)
==============  ======================================  =====================================
start           the loader's fork server (``_process``)  ``spawn``: a fresh interpreter
ring            an anonymous ``memfd``, its descriptor   a named segment of
                handed over at the start (``_shm``)      ``multiprocessing.shared_memory``
                                                         (``_named``), mapped by name
parent's death  ``PR_SET_PDEATHSIG`` plus a watchdog     a lifeline: a pipe whose write end
                on main's pid and start time             only main holds; EOF means main died
kept pools      yes; a new ring: its descriptor sent     yes; a new ring: its name sent
                over the pipe (``SCM_RIGHTS``)           over the pipe
==============  ======================================  =====================================

The default is ``"linux"`` where it runs (``engine_unsupported()`` is ``None``) and CUDA is not
initialised in this process (forking a process that initialised CUDA is unsafe; the fork server
itself was started clean, but a ``Loader`` made after ``torch.cuda.init()`` takes the engine
that needs no fork at all); ``"portable"`` otherwise. ``Loader(engine=...)`` chooses either.

A worker imports the user's script (as ``__mp_main__``) when its configuration names something
defined there, and under ``spawn`` on Windows always (``_process`` skips it otherwise): a
script that makes a ``Loader`` with workers outside an ``if __name__ == "__main__":`` guard
would then make one in each worker, which would start workers of its own. :func:`choose` refuses that in the worker,
naming the guard, and the worker's death is reported to main with the same advice
(``_pool.signal_name``). Everything a worker needs is pickled: :func:`check_picklable` names
the part of the source or pipeline that cannot be (a lambda, a local function).
"""

from __future__ import annotations

import multiprocessing
import pickle
import sys
from dataclasses import dataclass
from typing import Any

from stoker._core.errors import LoaderError
from stoker.loader import _pool, _shm
from stoker.loader._named import NamedRing
from stoker.loader._process import worker_process

__all__ = ["ENGINES", "Engine", "check_picklable", "choose", "cuda_initialised"]

ENGINES = ("linux", "portable")
GUARD = 'if __name__ == "__main__":'


@dataclass(frozen=True)
class Engine:
    """How a loader's workers start and share their ring (see the module docstring)."""

    name: str

    @property
    def portable(self) -> bool:
        return self.name == "portable"

    def check(self, config: Any) -> None:
        """Before workers start: spawn and the fork server both pickle all of ``config``, so
        what cannot be pickled is named up front (:func:`check_picklable`)."""
        check_picklable(config, self)

    def context(self) -> multiprocessing.context.BaseContext:
        return multiprocessing.get_context("spawn") if self.portable else _pool.mp_context()

    @property
    def start_method(self) -> str:
        return "spawn" if self.portable else self.context().get_start_method()

    def warm_up(self) -> None:
        """Start what later starts the workers, now (the Linux engine's fork server)."""
        if not self.portable:
            _pool.warm_up()

    def make_ring(self, size: int) -> tuple[Any, Any]:
        """``(ring, mapping)``: the ring's handle (pickled into each worker's configuration)
        and main's mapping (``.array()``); nothing of it is reserved yet."""
        if self.portable:
            return NamedRing.create(size)
        return _shm.SharedFd.create(size, name="stoker-ring", reserved=False)

    def process(self, ctx: Any, *, target: Any, args: tuple, name: str, data: tuple) -> Any:
        """A daemon worker process of ``ctx`` (not started); it skips the import of the main
        script where it can (``_process``)."""
        return worker_process(ctx, target=target, args=args, name=name, data=data)

    def lifeline(self, ctx: Any) -> tuple[Any, Any]:
        """``(main's end, the worker's end)`` of a pipe nothing is ever written to: the
        worker sees EOF when the last copy of main's end closes, that is when main dies. The
        Linux engine has ``PR_SET_PDEATHSIG`` instead: ``(None, None)``."""
        if not self.portable:
            return None, None
        return ctx.Pipe(duplex=False)[::-1]


LINUX = Engine("linux")
PORTABLE = Engine("portable")


def cuda_initialised() -> bool:
    """Whether this process has initialised CUDA through torch (never imports torch)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a partial or stub torch
        return False


def choose(engine: str | None, workers: int) -> Engine:
    """The engine for ``Loader(engine=...)``: ``None`` picks the default (module docstring).
    With workers, its server starts now, so that it boots while the loader opens its source."""
    if engine is not None and engine not in ENGINES:
        raise ValueError(
            f"engine must be one of {', '.join(map(repr, ENGINES))} or None, got {engine!r}"
        )
    why = _pool.engine_unsupported()
    if engine == "linux" and why is not None:
        raise LoaderError(
            f"engine='linux' needs Linux's memfd, posix_fallocate and fork server ({why}); "
            "engine='portable' runs here"
        )
    if engine is None:
        engine = "linux" if why is None and not cuda_initialised() else "portable"
    chosen = PORTABLE if engine == "portable" else LINUX
    if workers:
        if getattr(multiprocessing.current_process(), "_inheriting", False):
            raise LoaderError(
                "a Loader with workers is being made while a worker process imports the main "
                f"script (spawn starts each worker that way): put the code that runs the "
                f"loader under `{GUARD}`"
            )
        chosen.warm_up()
    return chosen


def check_picklable(config: Any, engine: Engine = PORTABLE) -> None:
    """Raise ``LoaderError`` naming what of a worker's configuration (the source, a transform,
    the rest of the pipeline) cannot be pickled for ``engine``'s start."""
    try:
        with _shm.probing():
            pickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL)
        return
    except Exception as e:  # noqa: BLE001 - named below
        error = e
    pipeline = config.pipeline
    parts: list[tuple[str, Any]] = [("the source", config.source)]
    for role in ("transforms", "pair_with"):
        parts.extend(_steps(getattr(pipeline, role, None), role))
    parts.append(("the pipeline", pipeline))
    what = "the worker configuration"
    for label, obj in parts:
        try:
            with _shm.probing():
                pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # noqa: BLE001
            what, error = label, e
            break
    how = "with spawn" if engine.portable else "from its fork server"
    raise LoaderError(
        f"engine={engine.name!r} starts each worker {how}, which pickles the source and "
        f"transforms, and {what} cannot be pickled ({type(error).__name__}: {error}); define "
        "it at module level (a lambda or a function defined inside another cannot be "
        "pickled), or use workers=0"
    ) from error


def _steps(t: Any, where: str) -> list[tuple[str, Any]]:
    """``t`` and, for a ``Compose``, each of its steps (innermost first, so the culprit is
    named rather than the chain that holds it), with where each sits."""
    if t is None:
        return []
    out: list[tuple[str, Any]] = []
    for i, step in enumerate(getattr(t, "transforms", ()) or ()):
        out.extend(_steps(step, f"{where}[{i}]"))
    fn = getattr(t, "fn", None)
    if callable(fn):
        out.append((f"{where} ({getattr(fn, '__qualname__', type(fn).__name__)})", fn))
    out.append((f"{where} ({type(t).__name__})", t))
    return out
