"""``engine="ray"``: a pack run as one Ray task per shard, through the shard jobs of
``jobs.py``. Ray is imported here only, when the engine is asked for.

NOTE [ The Ray engine ]

Driver
    The process that calls :func:`stoker.pack` runs ``jobs.run_jobs`` with a
    :class:`RayEngine`: the plan fixed as a local run fixes it, the job (its plan with it) put
    once into Ray's object store, and one task per shard submitted: the shard job with the
    images checked in the task's own process (a task holds one CPU). Outcomes come back as
    tasks finish; when every task is back, the driver finalizes (the side-cars merged, every
    count checked, the manifest written last). The bytes equal a local run's, whatever ran
    where.

Faults
    A task whose worker process dies (killed, out of memory, a node lost) is retried by Ray
    (``max_retries``); a retried shard is packed again from scratch, to the same bytes. A task
    that fails for good stops the run with an error naming the shard; pending tasks are
    cancelled. The journal ``OUT.pack-journal.partial`` holds the plan's fingerprint: rerunning
    the same command after the driver was killed finds it, and each task whose shard is done
    already (side-car of this plan, files verify) returns at once. A different plan, or
    ``resume=False``, starts over.

A URL OUT
    Each task stages its shard on its own node and uploads it, side-car last
    (``remote.shard_to_url``); the driver keeps its journal in its own staging folder and
    finalizes at the URL (``remote.finalize_url``). The nodes then share no filesystem: they
    need SRC (a path each sees, or a URL) and credentials for the storage (their own
    environment, or ``storage_options``, which travel with each task as its argument).

Convert
    A convert runs the same way: the plan holds the source's reader, which each task opens
    itself (a URL source is read through the shard cache of the task's node).

Cluster
    ``ray_address`` (``--address``), else ``RAY_ADDRESS``: an existing cluster, whose nodes
    see SRC and a local OUT at the same paths and have stoker installed. Neither: a Ray
    started on this machine for the run with ``workers`` CPUs (default: the usable cores),
    shut down at the end. A Ray already initialised in this process is used as it is and left running.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stoker._core.errors import PackError, StokerError
from stoker._core.progress import Progress
from stoker._core.quiet import quiet_logger
from stoker.pack.engines.jobs import ShardJob, run_jobs
from stoker.pack.plan.options import PackOptions
from stoker.pack.run.report import PackReport
from stoker.pack.run.shardjob import ShardOutcome
from stoker.storage.urls import redact

__all__ = ["MAX_RETRIES", "RayEngine", "import_ray", "run_ray"]

#: Times Ray runs a shard's task again after its worker process died.
MAX_RETRIES = 3


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`PackError` that names the extra to install."""
    try:
        import ray
    except ImportError as e:
        raise PackError(
            f"engine='ray' (--engine ray) needs Ray, which cannot be imported ({e}); "
            "install it with: pip install stoker[ray]"
        ) from None
    return ray


def shard_task(job: ShardJob, s: int) -> ShardOutcome:
    """One Ray task: shard ``s`` written (or found done) in the task's own process; a URL
    OUT: staged on the task's node and uploaded."""
    return job(s)  # no pool: the images are checked in this process


def _init(ray: Any, options: PackOptions) -> bool:
    """Connect to (or start) Ray; whether this run started it (and shuts it down)."""
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False}
    if options.ray_address:
        kw["address"] = options.ray_address
    elif not os.environ.get("RAY_ADDRESS"):
        kw.update(num_cpus=options.worker_count(), include_dashboard=False)
        # A Ray started here turns token authentication on (RAY_AUTH_MODE unset) and says so
        # with a warning in every pack's output; the setting stays, the warning is left out.
        with quiet_logger(_AUTH_LOGGER):
            ray.init(**kw)
        return True
    ray.init(**kw)
    return True


#: the logger of Ray's notice that a cluster it starts uses token authentication
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


def _failure(ray: Any, e: BaseException, s: int, job: ShardJob) -> PackError:
    """The error of a shard's task that failed for good (its cause, without Ray's wrapper)."""
    cause = getattr(e, "cause", None)
    if isinstance(e, ray.exceptions.RayTaskError) and cause is not None:
        why = f"{type(cause).__name__}: {cause}"
    else:
        why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    sid = job.plan.shard_id(s)
    prefix = job.options.prefix
    name = redact(prefix if sid is None else f"{prefix}-{sid:05d}")
    return PackError(
        f"shard {s} ({name}) failed on Ray (retried up to {MAX_RETRIES} times when its "
        f"worker died): {why}; rerun the same command to resume (finished shards are kept)"
    )


@dataclass(frozen=True)
class RayEngine:
    """Shard jobs as Ray tasks, one per shard, each holding one CPU (see the module NOTE)."""

    options: PackOptions

    def run(
        self, job: ShardJob, shards: Sequence[int], bar: Progress | None = None
    ) -> Iterator[ShardOutcome]:
        ray = import_ray()
        started = _init(ray, self.options)
        pending: list[Any] = []
        try:
            task = ray.remote(max_retries=MAX_RETRIES, num_cpus=1)(shard_task)
            job_ref = ray.put(job)  # the plan goes into the object store once
            refs = [task.remote(job_ref, s) for s in shards]
            shard_of = dict(zip(refs, shards))
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        got = ray.get(ref)
                    except (ray.exceptions.RayError, StokerError) as e:
                        raise _failure(ray, e, shard_of[ref], job) from None
                    if bar is not None:
                        bar.update(got.positions)
                    yield got
        finally:
            for ref in pending:  # a failure or Ctrl-C: the other shards' tasks stop
                with contextlib.suppress(Exception):
                    ray.cancel(ref)
            if started:
                ray.shutdown()


def run_ray(
    options: PackOptions, *, storage_options: Mapping[str, Any] | None = None
) -> PackReport:
    """Pack as ``options`` say, one Ray task per shard (see the module NOTE);
    ``storage_options``: how a URL SRC or OUT is reached."""
    import_ray()  # Ray missing is said before anything is listed or written
    return run_jobs(options, RayEngine(options), storage_options=storage_options)
