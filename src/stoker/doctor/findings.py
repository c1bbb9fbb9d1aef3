"""What a doctor run has found, one part per stage: :class:`Findings` and its parts.

:class:`Settings` holds the checked arguments. Each stage in :mod:`stoker.doctor.stages` fills
one part of :class:`Findings` (and may add to ``stages`` and ``not_measured``); a part is unset
(reading it raises ``AttributeError``) until its stage has run. :mod:`stoker.doctor.report`
turns the whole into the report.

| part | filled by | holds |
|---|---|---|
| ``storage`` | ``stages.storage`` | cold and warm reads, the packed-file reads, the payloads, the cache figure used; for a set in object storage, its downloads and the shard cache |
| ``decode`` | ``stages.decode`` | the decoders, the loader's decode step, the decoded sample |
| ``augment`` | ``stages.augment`` | the transforms' stage and op breakdown, output shape and dtype |
| ``alternatives`` | ``stages.alternatives`` | decode at reduced size, payloads resized at pack time |
| ``cost`` | ``stages.cost`` | one worker's per-sample :class:`~stoker.doctor.verdict.Cost` |
| ``loader`` | ``stages.loader`` | the loader runs, efficiency, predictions (the model's, and for the cores each run found free) |
| ``h2d`` | ``stages.device`` | the host-to-device copy |
| ``model`` | ``stages.device`` | the model's consumption |
| ``checks`` | ``stages.system`` | the system checks |
| ``judgement`` | ``stages.verdict`` | the verdict and the ranked changes |

``corrupt`` collects the samples training would stop at, one entry per key: those of the
doctor's sample that did not read (storage stage) or decode (decode stage), and those the loader runs skipped (which did not read
or decode, or failed in a transform or shape check).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from stoker.doctor.changes import Recommendation
from stoker.doctor.measure.decode import Decoder
from stoker.doctor.measure.loader import LoaderRun
from stoker.doctor.measure.source import SourceSample
from stoker.doctor.measure.storage import RemoteStorage
from stoker.doctor.measure.timing import Stage
from stoker.doctor.system import Check
from stoker.doctor.verdict import Cost, Verdict
from stoker.sampling.shards import DEFAULT_WINDOW

CUT = "cut: the budget ran out"  # a measurement the budget left no time for, not measured

__all__ = [
    "CUT",
    "Alternatives",
    "Augment",
    "Corrupt",
    "Decode",
    "Findings",
    "HostToDevice",
    "Judgement",
    "LoaderSweep",
    "Settings",
    "Storage",
]


@dataclass
class Settings:
    """The checked arguments of one run, and the clock of its budget."""

    path: str
    transforms: Any  # the resolved transform, or None
    transforms_label: str
    batch_size: int
    step_time_ms: float | None
    model: Any
    workers_max: int
    workers: list[int]  # the worker counts the loader is run at
    cores: int
    seconds: float
    sample_size: int
    cache: str  # "auto" | "warm" | "cold"
    run_loader: bool
    #: a set in object storage: how it is reached and cached (RemoteOptions; None: defaults),
    #: and the loader's shuffle mode and shard window the cache is judged under
    remote: Any = None
    shuffle: bool | str = True
    window: int = DEFAULT_WINDOW
    mix_with: tuple[str, ...] = ()  # the loader runs mix SOURCE with these at ``weights``
    weights: Any = None

    #: when the budget of ``seconds`` runs out, and the running stage's share of it
    #: (``time.perf_counter``; ``diagnose`` sets the share before each stage)
    deadline: float = math.inf
    stage_end: float = math.inf

    def left(self, until: float | None = None) -> float:
        """Seconds left before the deadline (or ``until``, when that comes first)."""
        end = self.deadline if until is None else min(until, self.deadline)
        return max(0.0, end - time.perf_counter())

    @property
    def step(self) -> float:
        """The least time of a loader or model measurement: a share of the budget (16 in all,
        and 3 per loader run), at most 1 s, never past the deadline."""
        units = 16 + (3 * len(self.workers) if self.run_loader else 0)
        return min(1.0, self.seconds / units, self.left())

    @property
    def half(self) -> float:
        """The least time of a main in-process measurement."""
        return self.step / 2

    @property
    def quarter(self) -> float:
        """The least time of a secondary in-process measurement."""
        return self.step / 4

    def cap(self, least: float) -> float:
        """How long a measurement of at least ``least`` seconds may go on while its interval
        is not tight: half of what is left of its stage's share (never less than ``least``)."""
        return max(least, self.left(self.stage_end) / 2)


@dataclass
class Storage:
    cold: Stage
    warm: Stage
    packed: tuple[Stage, Stage] | None  # (cold, warm) from one packed file; folders only
    payloads: list[bytes]  # the sampled payloads, as read
    use_cold: bool  # plan with the cold figure
    cache_note: str
    remote: RemoteStorage | None = None  # a set in object storage: downloads and the cache

    @property
    def read(self) -> Stage:
        """The read figure the model uses."""
        return self.cold if self.use_cold else self.warm

    @property
    def packed_read(self) -> Stage | None:
        """The packed-file read at the same cache state as :attr:`read`."""
        if self.packed is None:
            return None
        return self.packed[0] if self.use_cold else self.packed[1]


@dataclass
class Decode:
    decoders: dict[str, Decoder]
    pipeline_decode: Decoder
    payloads: list[bytes]  # the sampled payloads that decode
    full: list[np.ndarray]  # full size: the image as stored
    images: list[np.ndarray]  # as the loader decodes it (maybe at reduced scale)
    main: Stage | None  # the loader's decode step


@dataclass
class Augment:
    stage: Stage | None
    breakdown: list[tuple[str, float, float]]  # (op, wall s/sample, CPU s/sample)
    outputs: list[np.ndarray]
    in_shape: tuple[int, ...] | None
    out_shape: tuple[int, ...] | None
    out_dtype: str
    target: tuple[int, int] | None  # the output size, when the transforms shrink the image

    @property
    def sample_bytes(self) -> int:
        """Bytes of one output sample (0 without one)."""
        if not self.out_shape:
            return 0
        return int(np.prod(self.out_shape)) * np.dtype(self.out_dtype).itemsize


@dataclass
class Alternatives:
    scaled: Stage | None  # the fastest decode at reduced size
    #: payloads resized at pack time: decode, augment s/sample, label, their interval's high end
    resized: tuple[float, float, float, float, str, float] | None
    trade: str = ""  # why that reduced size changes what the model sees ("": it does not)


@dataclass
class LoaderSweep:
    runs: list[LoaderRun]
    efficiency: float
    predicted: dict[int, float]
    reads_warm: bool  # the runs read from the page cache although the plan is cold
    # the model again for each measured run, with the cores other processes left free during
    # that run in place of the load seen while the stages were timed
    given_load: dict[int, float] = field(default_factory=dict)

    @property
    def measured(self) -> dict[int, float]:
        return {r.workers: r.rate for r in self.runs}


@dataclass(frozen=True)
class Corrupt:
    """A sample that did not read or decode."""

    key: int | None
    where: str  # as the loader names it: "key 53 (class_01/00003.jpg)"
    reason: str
    found_by: str  # "read" | "decode" (the doctor's sample) | "loader" (skipped in a run)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HostToDevice:
    result: dict[str, Any] | None  # time_h2d's figures at the output dtype
    uint8_rate: float | None  # samples/s with uint8 batches, when the output is not uint8


@dataclass
class Judgement:
    workers: int  # the worker count the run is judged at
    loader_rate: float
    verdict: Verdict
    recommendations: list[Recommendation]


@dataclass(eq=False)
class Findings:
    """Everything one run found; the stages fill the parts in order."""

    settings: Settings
    sample: SourceSample
    stages: list[Stage] = field(default_factory=list)
    not_measured: list[dict[str, str]] = field(default_factory=list)
    corrupt: list[Corrupt] = field(default_factory=list)
    storage: Storage = field(init=False, repr=False)
    decode: Decode = field(init=False, repr=False)
    augment: Augment = field(init=False, repr=False)
    alternatives: Alternatives = field(init=False, repr=False)
    cost: Cost = field(init=False, repr=False)
    loader: LoaderSweep = field(init=False, repr=False)
    h2d: HostToDevice = field(init=False, repr=False)
    model: dict[str, Any] | None = field(init=False, repr=False)
    checks: list[Check] = field(init=False, repr=False)
    judgement: Judgement = field(init=False, repr=False)

    def skip(self, stage: str, reason: str) -> None:
        """Record a stage that could not run here, with the reason (its first line: a worker's
        traceback stays out of the report)."""
        first = reason.strip().splitlines()[0] if reason.strip() else reason
        self.not_measured.append({"stage": stage, "reason": first})

    def cut(self, *stages: str) -> None:
        """Record measurements the budget left no time for."""
        for stage in stages:
            self.skip(stage, f"{CUT} (--seconds {self.settings.seconds:g})")

    def found_corrupt(self, key: int | None, where: str, reason: str, found_by: str) -> None:
        """Record a sample that did not read or decode (once per key)."""
        if any(c.key == key and (key is not None or c.where == where) for c in self.corrupt):
            return
        self.corrupt.append(Corrupt(key, where, reason.strip().splitlines()[0], found_by))

    def add(self, stage: Stage | None) -> Stage | None:
        """Keep a measured stage for the report (``None`` is ignored); returns it."""
        if stage is not None:
            self.stages.append(stage)
        return stage
