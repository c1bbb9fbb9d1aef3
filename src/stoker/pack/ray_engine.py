"""``engine="ray"``: a pack run as one Ray task per shard, through the shard jobs of
``steps.py``. Ray is imported here only, when the engine is asked for.

NOTE [ The Ray engine ]

Driver
    The process that calls :func:`stoker.pack` lists SRC and fixes the plan as a one-machine
    pack does (``plan.make_plan``), puts it once into Ray's object store, and submits one task
    per shard: ``steps.run_shard`` with the images checked in the task's own process (a task
    holds one CPU). Results come back as tasks finish; one progress bar counts the positions
    of the finished shards. When every task is back, the driver finalizes
    (``steps.finalize``): every shard checked (sizes and CRCs), the rejects merged, the
    manifest written last. The bytes equal a one-machine pack's, whatever ran where.

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
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from stoker._core.errors import PackError, StokerError
from stoker._core.progress import make_progress
from stoker.pack.options import PackOptions
from stoker.pack.outputs import OutputPaths
from stoker.pack.packer import check_listing_rejects, make_out_dir
from stoker.pack.plan import Plan, fingerprint, make_plan
from stoker.pack.report import PackReport
from stoker.pack.steps import ShardOutcome, finalize, forget_shards, run_shard
from stoker.storage.urls import is_url, redact

__all__ = ["MAX_RETRIES", "import_ray", "run_ray"]

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


def shard_task(
    options: PackOptions, plan: Plan, fp: str, s: int, storage_options: Any = None
) -> ShardOutcome:
    """One Ray task: shard ``s`` packed (or found done) in the task's own process; a URL OUT:
    staged on the task's node and uploaded."""
    if is_url(options.prefix):
        from stoker.pack.remote import shard_to_url

        return shard_to_url(options, plan, fp, s, storage_options=storage_options)
    return run_shard(options, plan, fp, s, workers=0)


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
        with _quiet(_AUTH_LOGGER):
            ray.init(**kw)
        return True
    ray.init(**kw)
    return True


#: the logger of Ray's notice that a cluster it starts uses token authentication
_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Logger ``name`` at ERROR while the block runs (its level before, after)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _failure(ray: Any, e: BaseException, s: int, paths: OutputPaths, prefix: str) -> PackError:
    """The error of a shard's task that failed for good (its cause, without Ray's wrapper)."""
    cause = getattr(e, "cause", None)
    if isinstance(e, ray.exceptions.RayTaskError) and cause is not None:
        why = f"{type(cause).__name__}: {cause}"
    else:
        why = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    sid = paths.shard_ids[s]
    name = redact(prefix if sid is None else f"{prefix}-{sid:05d}")
    return PackError(
        f"shard {s} ({name}) failed on Ray (retried up to {MAX_RETRIES} times when its "
        f"worker died): {why}; rerun the same command to resume (finished shards are kept)"
    )


def run_ray(
    options: PackOptions, *, storage_options: Mapping[str, Any] | None = None
) -> PackReport:
    """Pack as ``options`` say, one Ray task per shard (see the module NOTE);
    ``storage_options``: how a URL SRC or OUT is reached."""
    ray = import_ray()
    t0 = time.perf_counter()
    plan = make_plan(options)  # a missing or unusable source is named before the output
    url = is_url(options.prefix)
    here, here_plan = options, plan  # where this driver writes: a URL's staging folder
    if url:
        from stoker.pack.remote import finalize_url, forget_url, refuse_existing_url, staged

        here, here_plan = staged(options, plan)
    make_out_dir(here.prefix)
    paths = OutputPaths.for_plan(here_plan, list_file=options.list_file, format=options.format)
    settings = options.journal_json()
    fp = fingerprint(plan, settings)
    same_plan = paths.journal_matches(fp)
    if not options.overwrite and not same_plan:
        if url:
            refuse_existing_url(options.prefix, storage_options)
        else:
            paths.refuse_existing()
    check_listing_rejects(here, here_plan, paths)
    if not (options.resume and same_plan):
        if url:
            forget_url(options, plan, storage_options)
        else:
            forget_shards(options, plan)
        paths.start_journal(fp, settings)
    started = _init(ray, options)
    what = "convert" if options.convert else "pack"
    bar = make_progress(len(plan.items), what, unit="img", enabled=options.progress)
    pending: list[Any] = []
    try:
        task = ray.remote(max_retries=MAX_RETRIES, num_cpus=1)(shard_task)
        plan_ref = ray.put(plan)
        so = dict(storage_options) if storage_options is not None else None
        refs = [task.remote(options, plan_ref, fp, s, so) for s in range(plan.n_shards)]
        shard_of = dict(zip(refs, range(plan.n_shards)))
        pending = list(shard_of)
        resumed = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                try:
                    got = ray.get(ref)
                except (ray.exceptions.RayError, StokerError) as e:
                    raise _failure(ray, e, shard_of[ref], paths, options.prefix) from None
                if got.skipped:
                    resumed.append(got.shard)
                bar.update(got.positions)
        bar.close()
        if url:
            report = finalize_url(
                options, plan, fp, t0, storage_options=storage_options, resumed=resumed
            )
        else:
            report = finalize(options, plan, fp, t0, resumed=resumed)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(paths.journal)
        return report
    finally:
        for ref in pending:  # a failure or Ctrl-C: the other shards' tasks stop
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        bar.close()
        if started:
            ray.shutdown()
