"""``diagnose`` (``stoker doctor SOURCE``): check the arguments, run the stages in order on a
sample of SOURCE and hand their findings to the report.

The run has a wall-clock budget of ``seconds``, a hard cap after start-up (imports, opening
SOURCE, the loader's process server): each stage gets a share of what is left (``_PLAN``),
each measurement its least time (``Settings.step``), then, while its interval is not tight,
up to half of what is left of that share; what no longer fits is cut, and the report says
so. The stages use up to ``sample_size`` samples (40 per second of budget; the stages:
:mod:`stoker.doctor.stages`). A stage that cannot run here (no CUDA, a room of stoker
not installed, an error) is listed under "not measured" with the reason; the rest of the
report still comes out.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from stoker._core.checks import check_choice, check_int
from stoker._core.system import usable_cores
from stoker.doctor.findings import Findings, Settings
from stoker.doctor.measure.source import sample_source
from stoker.doctor.report import Report, report_data
from stoker.doctor.resolve import resolve_transforms
from stoker.doctor.stages import (
    alternatives,
    augment,
    cost,
    decode,
    device,
    storage,
    system,
    verdict,
)
from stoker.doctor.stages import loader as loader_sweep
from stoker.sampling.shards import DEFAULT_WINDOW

__all__ = ["diagnose"]

#: the run's wall-clock budget by default, and the most it may be given (seconds)
DEFAULT_SECONDS = 60.0
MAX_SECONDS = 3600.0
#: the most workers measured by default, however many cores there are
DEFAULT_WORKERS_CAP = 8
#: progress steps besides one per worker count: storage, decode, augment, alternatives,
#: host-to-device, model, verdict
_FIXED_STEPS = 7
#: the stages in order, with their weights in the share of the budget each gets (``None``:
#: 4 per loader run); a progress step after each named one
_PLAN: tuple[tuple[str, float | None, Callable[..., None]], ...] = (
    ("storage", 1.0, storage.run),
    ("decode", 1.0, decode.run),
    ("augment", 0.5, augment.run),
    ("alternatives", 1.0, alternatives.run),
    ("", 0.25, cost.run),
    ("", None, loader_sweep.run),
    ("host-to-device", 0.5, device.run_h2d),
    ("model", 1.0, device.run_model),
    ("", 0.0, system.run),
    ("verdict", 0.0, verdict.run),
)


def diagnose(
    source: str | os.PathLike[str],
    /,
    *,
    transforms: Any = None,
    batch_size: int = 64,
    step_time_ms: float | None = None,
    model: Any = None,
    workers_max: int | None = None,
    seconds: float = DEFAULT_SECONDS,
    sample_size: int = 256,
    cache: str = "auto",
    loader: bool = True,
    progress: bool | None = None,
    remote: Any = None,
    shuffle: bool | str = True,
    window: int | None = None,
    mix_with: Sequence[str] = (),
    weights: Any = None,
) -> Report:
    """Measure each stage of the input pipeline for ``source`` and return a :class:`Report`.

    - ``transforms``: a transform, a preset name, ``"module:attr"`` or ``None``;
    - ``step_time_ms`` / ``model``: what the model consumes (a step time per batch, or an
      ``nn.Module`` (or callable returning one, or ``"module:attr"``) timed on random batches);
    - ``workers_max``: the loader is measured at 1..N workers (default: usable cores);
    - ``seconds``: the run's wall-clock budget (default 60): each loader and model measurement
      takes at least ``min(seconds, 1)`` s (each in-process stage a half or a quarter of it),
      then goes on until its interval is tight while the budget lasts; ``sample_size``:
      samples read and decoded;
    - ``cache``: ``"warm"``, ``"cold"`` or ``"auto"`` (warm when the data fits in half of the
      free memory): which read figure the model uses;
    - ``loader``: ``False`` skips the loader runs (predictions only);
    - ``remote``: for a set's manifest URL, how it is reached and cached
      (:class:`~stoker.formats.remote.RemoteOptions`); ``shuffle`` (``True`` or ``"shards"``)
      and ``window`` (default :data:`~stoker.sampling.shards.DEFAULT_WINDOW`): the loader's
      order the shard cache is judged under;
    - ``mix_with``, ``weights``: the loader runs read ``source`` mixed with these sets
      (``docs/mixing.md``; the other stages measure ``source``), and the report gives each
      set's share of the samples and rate.
    """
    t_start = time.perf_counter()
    batch_size = check_int("batch_size", batch_size, minimum=1)
    if step_time_ms is not None and model is not None:
        raise ValueError("give step_time_ms or model, not both")
    if step_time_ms is not None and not (
        isinstance(step_time_ms, (int, float)) and step_time_ms > 0
    ):
        raise ValueError(
            f"step_time_ms (--step-time) must be > 0 (milliseconds per batch), got {step_time_ms!r}"
        )
    if not (isinstance(seconds, (int, float)) and 0 < seconds <= MAX_SECONDS):
        raise ValueError(
            f"seconds must be in (0, {MAX_SECONDS:g}] (the run's budget), got {seconds!r}"
        )
    check_choice("cache", cache, ("auto", "warm", "cold"))
    if shuffle is not True and shuffle != "shards":
        raise ValueError(f'shuffle must be True or "shards", got {shuffle!r}')
    window = check_int("window", DEFAULT_WINDOW if window is None else window, minimum=1)
    sample_size = check_int("sample_size", sample_size, minimum=1)
    cores = usable_cores()
    if workers_max is None:
        workers_max = max(1, min(cores, DEFAULT_WORKERS_CAP))
    workers_max = check_int("workers_max", workers_max, minimum=1)
    t_obj, t_label = resolve_transforms(transforms)
    n = min(sample_size, max(16, int(40 * seconds)))  # the passes over it fit the budget
    sample = sample_source(os.fspath(source), n=n, remote=remote)
    _start_up(loader)
    t_clock = time.perf_counter()
    settings = Settings(
        path=os.fspath(source),
        transforms=t_obj,
        transforms_label=t_label,
        batch_size=batch_size,
        step_time_ms=step_time_ms,
        model=model,
        workers_max=workers_max,
        workers=loader_sweep.worker_counts(workers_max),
        cores=cores,
        seconds=seconds,
        deadline=t_clock + seconds,
        sample_size=sample_size,
        cache=cache,
        run_loader=loader,
        remote=remote,
        shuffle=shuffle,
        window=window,
        mix_with=tuple(mix_with),
        weights=weights,
    )
    steps = _Steps(_FIXED_STEPS + (len(settings.workers) if loader else 0), progress)
    f = Findings(settings, sample)
    try:
        _run_stages(f, steps)
    finally:
        f.sample.close()
        steps.close()
    elapsed = time.perf_counter() - t_start
    return Report(report_data(f, elapsed_s=elapsed, startup_s=t_clock - t_start))


def _start_up(loader: bool) -> None:
    """What the run needs before its clock starts: the decoders, torch (the device stages),
    the loader and its process server."""
    from stoker.doctor.measure.decode import decoders
    from stoker.doctor.measure.device import cuda_state

    decoders()
    cuda_state()
    if loader:
        from stoker.loader import warm_up

        warm_up()


def _run_stages(f: Findings, step: _Steps) -> None:
    """Each stage in turn, with its share of what is left of the budget."""
    s = f.settings
    weights = [4.0 * len(s.workers) * s.run_loader if w is None else w for _, w, _ in _PLAN]
    for j, (name, weight, run) in enumerate(_PLAN):
        rest = sum(weights[j:])
        s.stage_end = time.perf_counter() + (s.left() * weights[j] / rest if rest else 0.0)
        if weight is None:  # the loader sweep ticks once per worker count
            run(f, step)
        else:
            run(f)
        if name:
            step(name)


class _Steps:
    """The run's progress bar: one tick per stage and per loader worker count."""

    def __init__(self, total: int, enabled: bool | None) -> None:
        from stoker._core.progress import make_progress

        self.bar = make_progress(total, "stoker doctor", unit="step", enabled=enabled)

    def __call__(self, what: str) -> None:
        self.bar.set_postfix_str(what)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
