"""A run as shard jobs placed by an engine: plan, shard jobs, finalize.

NOTE [ Shard jobs and engines ]

Driver
    The process that calls :func:`run_jobs` lists SRC and fixes the plan (``plan.make_plan``),
    makes the output folder ready (a URL OUT: this machine's staging folder), and checks the
    journal ``OUT.pack-journal.partial``: a rerun whose plan has the same fingerprint keeps
    every shard that is done (side-car of this plan, files of its sizes that verify) and packs
    the others again from scratch; a different plan, or ``resume=False``, forgets every shard.
    Then it hands one :class:`ShardJob` per shard to an engine and, when every job is back,
    finalizes (``setfiles.finalize``, ``remote.finalize_url`` for a URL): the side-cars merged,
    every count checked, the rejects list, the ``.lst`` and the manifest written last.

Shard job
    :class:`ShardJob` is a pure function of its plan: shard ``s`` written (``shardjob.run_shard``;
    a URL OUT: staged and uploaded, ``remote.shard_to_url``) to the same bytes wherever it
    runs. It is picklable (options, plan, fingerprint, ``storage_options``).

Engine
    An engine decides only where jobs run: ``run(job, shards, bar)`` yields each shard's
    :class:`~stoker.pack.run.shardjob.ShardOutcome` as it finishes, advances the progress bar by
    the positions done, and stops the jobs not yet done when the caller stops.
    :class:`LocalEngine` runs a pack's shards one after another in this process, which writes
    them, while one pool of processes checks the images of all of them (the output bytes do
    not depend on the worker count, and a decoder that crashes a worker costs only its file:
    ``pool.py``); a convert's shards are each read and written by one process: the first one
    in this process, which then starts a pool of processes for the others only when they
    would finish sooner there, counting the pool's start (``POOL_START_S``; a convert writes
    tens of thousands of records in that time), one job per process at a time (all in this
    process when there is one worker or one shard). ``ray_engine.RayEngine`` runs one Ray task per shard. Processes start by the one
    start method the engine is given (``_procs.default_start_method``: ``forkserver``, or
    ``spawn`` where there is none); every job and task crosses as a pickle. A scheduler of its own (a Slurm array, a Kubernetes job)
    needs no engine: ``stoker pack --plan-only``, then ``--shards`` per job, then
    ``--finalize`` (``docs/scale.md``).

Shutdown (the local pool)
    Normal end: the pool is shut down after the last job. Exception, Ctrl-C or a SIGTERM
    handler's ``SystemExit``: jobs not started are cancelled, each worker finishes the shard
    it holds (one still busy after a grace period is killed), the exception propagates; a
    shard left without its side-car is packed again by the rerun. SIGKILL of the driver: each
    worker watches it and exits (``_procs.py``); its shard's partial files are written again.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from stoker._core.progress import Progress, make_progress
from stoker.pack._procs import START_METHODS
from stoker.pack.commit.destination import destination
from stoker.pack.commit.setfiles import check_listing_rejects, make_out_dir
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.plan import Plan, fingerprint, make_plan
from stoker.pack.run.report import PackReport
from stoker.pack.run.shardjob import ShardOutcome, output_paths

if TYPE_CHECKING:
    from stoker.pack.run.pool import Pool

__all__ = ["Engine", "LocalEngine", "ShardJob", "run_jobs"]


@dataclass(frozen=True)
class ShardJob:
    """Shard ``s`` of one plan, written wherever it is called (see the module NOTE)."""

    options: PackOptions
    plan: Plan
    fp: str
    storage_options: Mapping[str, Any] | None = None

    def __call__(
        self, s: int, *, pool: Pool | None = None, bar: Progress | None = None
    ) -> ShardOutcome:
        """Shard ``s`` written; ``pool``: the processes that check its images (``None``: this
        process does); ``bar``: advanced by each position done."""
        dest = destination(self.options, self.storage_options)
        return dest.shard(self.options, self.plan, self.fp, s, pool=pool, bar=bar)

    @property
    def per_item(self) -> bool:
        """Whether a shard's items can be spread over processes (a pack's images: checked
        apart, written in order), or are read and written by one process (a convert)."""
        return self.plan.reader is None


class Engine(Protocol):
    """Where shard jobs run: every shard of ``shards`` run once (``job(s)``), outcomes
    yielded as they finish, ``bar`` advanced by the positions done; the jobs still running
    stop when the generator is closed."""

    def run(
        self, job: ShardJob, shards: Sequence[int], bar: Progress | None = None
    ) -> Iterator[ShardOutcome]: ...


# ---------------------------------------------------------------- the local pool
_JOB: ShardJob | None = None

#: What starting a pool of shard-job processes costs before the first record is written: the
#: start method's server and each process's imports of the reader and the writer (0.3-0.6 s
#: measured on 2 cores). A convert writes tens of thousands of records in that time.
POOL_START_S = 0.5


def _pool_pays(left_s: float, n: int) -> bool:
    """Whether ``n`` processes finish ``left_s`` seconds of shard jobs (as timed in this
    process) sooner than this process alone, counting the pool's start."""
    return left_s * (1 - 1 / n) > POOL_START_S


def _init_job(main_pid: int, job: ShardJob) -> None:
    """Pool initializer: the worker's start (``worker.init_worker``) and its plan, once."""
    from stoker.pack.run.worker import init_worker

    global _JOB
    init_worker(main_pid)
    _JOB = job


def _run_job(s: int) -> ShardOutcome:
    assert _JOB is not None  # set by the initializer
    return _JOB(s)


@dataclass(frozen=True)
class LocalEngine:
    """Shard jobs on this machine, with ``workers`` processes started by ``start_method``
    (``None``: ``_procs.default_start_method``); see the module NOTE."""

    workers: int
    start_method: str | None = None

    def __post_init__(self) -> None:
        if self.start_method is not None and self.start_method not in START_METHODS:
            raise ValueError(
                f"start_method must be one of {', '.join(START_METHODS)}, got {self.start_method!r}"
            )

    def run(
        self, job: ShardJob, shards: Sequence[int], bar: Progress | None = None
    ) -> Iterator[ShardOutcome]:
        from stoker.pack.run.pool import Pool

        if job.per_item:  # written here, shard after shard; one pool checks every image
            images = Pool(max(1, self.workers), start_method=self.start_method)
            try:
                for s in shards:
                    yield job(s, pool=images, bar=bar)
            finally:
                images.close()
            return
        todo = list(shards)
        n = min(self.workers, len(todo))
        while n > 1 and todo:  # the first shard written here says whether a pool pays
            got = job(todo.pop(0), bar=bar)
            yield got
            if not got.skipped:
                if not _pool_pays(got.seconds * len(todo), n):
                    n = 1
                break
        n = min(n, len(todo))
        if n <= 1:
            for s in todo:
                yield job(s, bar=bar)
            return
        pool = Pool(n, job, initializer=_init_job, start_method=self.start_method)
        try:
            ex = pool.get()
            pending: set[Future] = {ex.submit(_run_job, s) for s in todo}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    got = fut.result()
                    if bar is not None:
                        bar.update(got.positions)
                    yield got
        finally:
            pool.close()


# ---------------------------------------------------------------- the driver
def _close(outcomes: Iterator[ShardOutcome]) -> None:
    close = getattr(outcomes, "close", None)
    if close is not None:
        close()


def run_jobs(
    options: PackOptions,
    engine: Engine,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> PackReport:
    """Pack (or convert) as ``options`` say, as shard jobs placed by ``engine``, then
    finalize (see the module NOTE); ``storage_options``: how a URL SRC or OUT is reached."""
    t0 = time.perf_counter()
    plan = make_plan(options)  # a missing or unusable source is named before the output
    dest = destination(options, storage_options)
    here, here_plan = dest.here(options, plan)  # where this driver writes (a URL: staging)
    make_out_dir(here.prefix)
    paths = output_paths(here, here_plan)
    settings = options.journal_json()
    fp = fingerprint(plan, settings)
    same_plan = paths.journal_matches(fp)
    if not options.overwrite and not same_plan:
        dest.refuse_existing(options, paths)
    check_listing_rejects(here, here_plan, paths)
    if not (options.resume and same_plan):
        dest.forget(options, plan)
        paths.start_journal(fp, settings)
    what = "convert" if options.convert else "pack"
    bar = make_progress(len(plan.items), what, unit="img", enabled=options.progress)
    so = dict(storage_options) if storage_options is not None else None
    job = ShardJob(options, plan, fp, so)
    resumed = []
    outcomes = engine.run(job, range(plan.n_shards), bar)
    try:
        for got in outcomes:
            if got.skipped:
                resumed.append(got.shard)
    except BaseException:
        _close(outcomes)  # every job stopped before the shards are looked at
        with contextlib.suppress(Exception):
            dest.abandon(options, plan, paths.journal)
        raise
    finally:
        _close(outcomes)
        bar.close()
    # check=False: every shard was just written or verified by its job; sizes are checked
    report = dest.finalize(options, plan, fp, t0, resumed=resumed, check=False)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(paths.journal)
    return report
