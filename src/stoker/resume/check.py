"""``check_resume``: prove on a user's own loader configuration that a run SIGKILLed at random
steps and resumed from its last saved state delivers exactly the samples of a run that was
never interrupted.

How it runs (every run in a child process of its own, started with ``spawn``):

1. the reference: ``epochs`` epochs on ``world_size`` ranks without a kill, and the same on
   ``resume_on`` ranks when that differs; each logs a digest of every sample (``_run``);
2. the killed run: the ranks in lockstep, rank 0's ``state_dict()`` saved every
   ``save_every`` steps as a JSON checkpoint; at each of ``kills`` steps, drawn at random
   from ``seed``, the child is SIGKILLed; the next child loads the last checkpoint into every
   rank (on ``resume_on`` ranks from the first kill on) and goes on; the last runs to the end;
3. the samples each killed child delivered up to its last checkpoint, and everything the last
   child delivered, are compared with the reference (``_compare``): index, key, pixels and
   fields of every sample. What a killed child delivered after its last checkpoint is what a
   real job trains on again after the restart: it is not compared, and its steps are counted
   (``replayed_steps``).

The children talk to the parent only through a pipe of small tuples and the files they
write (flat binary logs, JSON checkpoints); nothing is unpickled from a file.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._core.checks import check_int
from stoker._core.errors import CheckResumeError, with_child_traceback
from stoker.resume._compare import Difference, _diff, compare_epoch_elastic, compare_epoch_exact
from stoker.resume._run import Segment, read_log, run_segment

__all__ = ["ResumeReport", "check_resume"]


@dataclass
class ResumeReport:
    """What :func:`check_resume` found. ``passed``; ``difference``: the first sample that is
    not the uninterrupted run's (``None`` when it passed); ``kills``: the steps at which a
    child was killed; ``resumes``: for each restart, the step of the state it resumed from
    (``None``: no state had been saved, it started over) and the ranks it resumed on;
    ``samples``: the deliveries compared; ``replayed_steps``: steps run again after a
    restart (between the state resumed from and the kill); ``steps``: the uninterrupted
    run's steps."""

    passed: bool
    world_size: int
    resume_on: int
    epochs: int
    save_every: int
    steps: int
    kills: list[int]
    resumes: list[dict[str, Any]]
    samples: int
    replayed_steps: int
    seconds: float
    reference_seconds: float
    difference: Difference | None = None
    notes: list[str] = field(default_factory=list)
    bounded: bool = False  # every run stopped at ``steps`` (``check_resume(steps=)``)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "difference"}
        d["difference"] = None if self.difference is None else self.difference.to_dict()
        return d

    def verdict(self) -> str:
        ranks = (
            f"{self.world_size} rank{'s' if self.world_size > 1 else ''}"
            if self.resume_on == self.world_size
            else f"{self.world_size} -> {self.resume_on} rank{'s' if self.resume_on > 1 else ''}"
        )
        head = (
            f"{len(self.kills)} SIGKILL{'s' if len(self.kills) != 1 else ''} at "
            f"step{'s' if len(self.kills) != 1 else ''} "
            f"{', '.join(map(str, self.kills)) or '-'} of {self.steps}"
            f"{' (the bound)' if self.bounded else ''}, {ranks}, "
            f"{self.epochs} epoch{'s' if self.epochs > 1 else ''}, state saved every "
            f"{self.save_every} steps"
        )
        if self.passed:
            return (
                f"PASS: resume is exact: {head}; {self.samples} samples delivered across the "
                f"kills are the uninterrupted run's, each with the same pixels and fields "
                f"({self.replayed_steps} steps run again after a restart) "
                f"[{self.seconds:.1f} s]"
            )
        assert self.difference is not None
        return f"FAIL: {head}; first difference: {self.difference.describe()}"

    def __str__(self) -> str:
        return "\n".join([self.verdict(), *self.notes])


def check_resume(
    make_loader: Callable[..., Any],
    *,
    kills: int = 3,
    world_size: int = 1,
    resume_on: int | None = None,
    epochs: int = 2,
    save_every: int | None = None,
    seed: int = 0,
    steps: int | None = None,
    timeout: float = 300.0,
    log: Callable[[str], None] | None = None,
) -> ResumeReport:
    """Kill a run of ``make_loader``'s loaders ``kills`` times and check that the samples
    delivered across the kills are exactly an uninterrupted run's (see the module docstring).

    ``make_loader(rank=r, world_size=n)`` returns a ``stoker.Loader`` (or anything with its
    ``state_dict``, ``load_state_dict``, ``epoch``, ``len`` and batches with ``indices``,
    ``keys``, ``images``, ``labels``, ``fields``) for rank ``r`` of ``n`` (on one rank,
    ``world_size=resume_on=1``, a ``make_loader()`` of no arguments will do); it runs in child
    processes, so it must be picklable: a module-level function, a ``functools.partial`` of
    one, or a :class:`~stoker.resume.LoaderSpec`. ``resume_on``: the ranks every run after the
    first kill resumes on (default: ``world_size``). ``save_every``: steps between saved states
    (default: a quarter of the steps between two kills). ``seed``: draws the kill steps.
    ``steps``: stop every run at that step, for a set too large to run whole (the check then
    covers the first ``steps`` steps; the uninterrupted runs finish the epoch in progress when
    ``resume_on`` differs, since a resume on other ranks is checked against a whole epoch).
    ``timeout``: seconds a child may go without finishing a step before it counts as stalled
    (:class:`~stoker.CheckResumeError`, as is any child that fails: its message ends with the
    child's error in one line, its ``__cause__`` holds the child's traceback). Returns a
    :class:`ResumeReport`; a failed check is a report, not an exception.
    """
    if not callable(make_loader):
        raise TypeError(
            "make_loader must be a callable make_loader(rank=, world_size=) -> Loader, got "
            f"{type(make_loader).__name__}"
        )
    kills = check_int("kills", kills, minimum=0, maximum=1000)
    world_size = check_int("world_size", world_size, minimum=1, maximum=64)
    resume_on = check_int(
        "resume_on", world_size if resume_on is None else resume_on, minimum=1, maximum=64
    )
    epochs = check_int("epochs", epochs, minimum=1, maximum=1000)
    if save_every is not None:
        save_every = check_int("save_every", save_every, minimum=1)
    if steps is not None:
        steps = check_int("steps", steps, minimum=2)
    if not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    make_loader = _ranked(make_loader, max(world_size, resume_on))
    say = log or (lambda _msg: None)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stoker-check-resume-") as tmp:
        runner = _Runner(make_loader, epochs, tmp, timeout, steps)
        refs: dict[int, np.ndarray] = {}
        ref_steps: dict[int, int] = {}
        for w in dict.fromkeys([world_size, resume_on]):
            elastic = resume_on != world_size
            info = runner.run(
                w,
                save_every=0,
                kill_at=None,
                resume_from=None,
                name=f"ref{w}",
                # a killed run that went on with more ranks per step than w delivered more
                stop=None if steps is None else -(-steps * max(world_size, resume_on) // w),
                whole_epochs=elastic,
            )
            refs[w], ref_steps[w] = read_log(runner.log(f"ref{w}")), info["step"]
            say(f"uninterrupted run on {w} rank(s): {ref_steps[w]} steps, {len(refs[w])} samples")
            _check_ranks_differ(refs[w], w)
        ref_seconds = time.perf_counter() - t0
        least = min(*ref_steps.values(), steps or 2**62)
        every = save_every or max(2, least // (4 * (kills + 1)))
        rng = np.random.default_rng(seed)
        pool = np.arange(every + 1, least) if least > every + 1 else np.arange(1, max(least, 1))
        chosen = sorted(rng.choice(pool, size=min(kills, len(pool)), replace=False).tolist())
        notes = []
        if len(chosen) < kills:
            notes.append(f"only {len(chosen)} kill steps fit in a run of {least} steps")
        killed = _KilledRun(runner, world_size, resume_on, every, say)
        killed.go(chosen)
        diff = _compare(killed, refs, world_size, epochs, truncated=steps is not None)
        return ResumeReport(
            passed=diff is None,
            world_size=world_size,
            resume_on=resume_on,
            epochs=epochs,
            save_every=every,
            steps=min(ref_steps[world_size], steps or 2**62),
            kills=killed.kills,
            resumes=killed.resumes,
            samples=int(sum(len(g) for g, _ in killed.kept)),
            replayed_steps=killed.replayed_steps,
            seconds=round(time.perf_counter() - t0, 3),
            reference_seconds=round(ref_seconds, 3),
            difference=diff,
            notes=notes,
            bounded=steps is not None,
        )


def _ranked(make_loader: Callable[..., Any], ranks: int) -> Callable[..., Any]:
    """``make_loader`` as ``f(rank=, world_size=)``: as it is when it takes them (or shows no
    signature); a factory of no arguments when one rank is all it runs; else ``TypeError``
    here, naming the signature it needs, rather than in every child."""
    try:
        sig = inspect.signature(make_loader)
    except (TypeError, ValueError):
        return make_loader  # no signature to read: the child's call says what is wrong
    with contextlib.suppress(TypeError):
        sig.bind(rank=0, world_size=ranks)
        return make_loader
    if ranks == 1:
        with contextlib.suppress(TypeError):
            sig.bind()
            return _OneRank(make_loader)
    sig = sig.replace(return_annotation=inspect.Signature.empty)
    raise TypeError(
        f"make_loader{sig} must take make_loader(rank=, world_size=) and pass both on to the "
        f"loader it builds (Loader(..., rank=rank, world_size=world_size)) to run {ranks} ranks"
    )


@dataclass(frozen=True)
class _OneRank:
    """A factory of no arguments as ``f(rank=0, world_size=1)``; picklable when it is."""

    make_loader: Callable[[], Any]

    def __call__(self, *, rank: int, world_size: int) -> Any:
        return self.make_loader()


class _Runner:
    """Starts one child per run and waits for it (or kills it at a step)."""

    def __init__(
        self, factory: Callable[..., Any], epochs: int, tmp: str, timeout: float, stop: int | None
    ) -> None:
        self.factory, self.epochs, self.tmp, self.timeout = factory, epochs, tmp, timeout
        self.stop = stop
        self.ctx = multiprocessing.get_context("spawn")

    def log(self, name: str) -> str:
        return os.path.join(self.tmp, f"{name}.log")

    def checkpoint(self, name: str) -> str:
        return os.path.join(self.tmp, f"{name}.ckpt.json")

    def run(
        self,
        world: int,
        *,
        save_every: int,
        kill_at: int | None,
        resume_from: str | None,
        name: str,
        stop: int | None = None,
        whole_epochs: bool = False,
    ) -> dict[str, Any]:
        """Run to the end (``{"step", "records", "start"}``), or until the child reports step
        ``kill_at`` and is SIGKILLed (``{"killed": step, "start"}``)."""
        job = Segment(
            factory=self.factory,
            world_size=world,
            epochs=self.epochs,
            log=self.log(name),
            checkpoint=self.checkpoint(name),
            save_every=save_every,
            resume_from=resume_from,
            stop=self.stop if stop is None else stop,
            whole_epochs=whole_epochs,
        )
        recv, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=run_segment, args=(job, send), name=f"check-resume-{name}")
        proc.start()
        send.close()
        out: dict[str, Any] = {}
        try:
            while True:
                if not recv.poll(self.timeout):
                    raise CheckResumeError(
                        f"the run {name} on {world} rank(s) finished no step in {self.timeout:g} s "
                        "(a stalled loader?)"
                    )
                try:
                    kind, value = recv.recv()
                except EOFError:
                    proc.join()
                    raise CheckResumeError(
                        f"the run {name} on {world} rank(s) died (exit status {proc.exitcode}) "
                        "before it finished"
                    ) from None
                if kind == "start":
                    out["start"] = value
                elif kind == "step" and kill_at is not None and value >= kill_at:
                    proc.kill()  # SIGKILL
                    out["killed"] = value
                    return out
                elif kind == "done":
                    out.update(value)
                    return out
                elif kind == "error":
                    line, text = value
                    err = CheckResumeError(
                        f"the run {name} on {world} rank(s) failed in its child process: {line}"
                    )
                    raise with_child_traceback(err, text)
        finally:
            if proc.is_alive() and "killed" not in out:
                proc.kill()
            proc.join()
            proc.close()  # its sentinel, now: an error's traceback keeps this frame alive
            recv.close()


class _KilledRun:
    """The run that is killed and resumed: what each child delivered that counts."""

    def __init__(
        self, runner: _Runner, world: int, resume_on: int, every: int, say: Callable[[str], None]
    ) -> None:
        self.runner, self.world, self.resume_on = runner, world, resume_on
        self.every, self.say = every, say
        self.batch_size, self.drop_last = 1, False  # the loader's, as the first child reports
        self.kept: list[tuple[np.ndarray, int]] = []  # (rows, step resumed from or -1)
        self.kills: list[int] = []
        self.resumes: list[dict[str, Any]] = []
        self.replayed_steps = 0
        self.starts: list[tuple[int, int, int | None]] = []  # (world, epoch, world of the state)

    def go(self, kill_steps: list[int]) -> None:
        resume: str | None = None
        resumed_step, state_world = -1, None
        world = self.world
        for i, k in enumerate([*kill_steps, None]):
            name = f"run{i}"
            info = self.runner.run(
                world, save_every=self.every, kill_at=k, resume_from=resume, name=name
            )
            self.starts.append((world, info["start"]["epoch"], state_world))
            self.batch_size = info["start"]["batch_size"]
            self.drop_last = info["start"]["drop_last"]
            rows, own = read_log(self.runner.log(name)), resumed_step
            if "killed" not in info:
                self.kept.append((rows, own))
                return
            self.kills.append(info["killed"])
            ckpt_path = self.runner.checkpoint(name)
            if os.path.exists(ckpt_path):
                with open(ckpt_path, encoding="utf-8") as f:
                    ckpt = json.load(f)
                resume, resumed_step, state_world = ckpt_path, ckpt["step"], ckpt["world_size"]
                kept = int(ckpt["records"])
            else:  # killed before its first save: the next starts where this one started
                kept = 0
            self.kept.append((rows[:kept], own))
            self.replayed_steps += info["killed"] - max(resumed_step, 0)
            world = self.resume_on
            self.resumes.append(
                {
                    "killed_at": info["killed"],
                    "resumed_from": None if resumed_step < 0 else resumed_step,
                    "world_size": world,
                }
            )
            self.say(
                f"killed at step {info['killed']}; resuming on {world} rank(s) from "
                + (f"the state of step {resumed_step}" if resumed_step >= 0 else "the start")
            )


def _compare(
    run: _KilledRun, refs: dict[int, np.ndarray], world_size: int, epochs: int, *, truncated: bool
) -> Difference | None:
    """The first difference, epoch by epoch. ``truncated``: the runs stopped at a step, so the
    last epoch the killed run reached is compared as far as it got."""
    got = np.concatenate([rows for rows, _ in run.kept])
    resumed = np.concatenate([np.full(len(rows), step, np.int64) for rows, step in run.kept])
    elastic = {epoch for world, epoch, sw in run.starts if sw is not None and sw != world}
    last_world = run.starts[-1][0]
    last_epoch = int(got["epoch"].max()) if len(got) else 0
    for epoch in range(epochs):
        sel = got["epoch"] == epoch
        g, res = got[sel], resumed[sel]
        partial = truncated and epoch == last_epoch
        worlds = sorted(set(g["world"].tolist()))
        if epoch in elastic or len(worlds) > 1:
            diff = compare_epoch_elastic(
                g,
                res,
                refs[world_size][refs[world_size]["epoch"] == epoch],
                epoch,
                new_world=run.resume_on,
                batch_size=run.batch_size,
                drop_last=run.drop_last,
                partial=partial,
            )
        else:
            w = worlds[0] if worlds else last_world
            x = refs[w][refs[w]["epoch"] == epoch]
            diff = compare_epoch_exact(g, res, x, epoch, w, partial=partial)
        if diff is not None:
            return diff
        if truncated and epoch == last_epoch:
            return None
    extra = got[got["epoch"] >= epochs]
    if len(extra):
        g = extra[0]
        return _diff("extra", int(g["epoch"]), int(g["rank"]), int(g["world"]), None, g, -1)
    return None


def _check_ranks_differ(log: np.ndarray, world: int) -> None:
    """Ranks that all delivered the same samples: a factory that does not pass ``rank`` and
    ``world_size`` on to the loader (each rank would train on every sample)."""
    if world < 2 or not len(log):
        return
    first = log[log["epoch"] == log["epoch"][0]]
    seqs = [first["index"][first["rank"] == r] for r in range(world)]
    if len(seqs[0]) > 1 and all(np.array_equal(seqs[0], q) for q in seqs[1:]):
        raise CheckResumeError(
            f"all {world} ranks delivered the same samples in the same order: make_loader must "
            "pass rank= and world_size= to the loader it builds (Loader(..., rank=rank, "
            "world_size=world_size))"
        )
