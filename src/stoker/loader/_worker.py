"""The worker side of the loader: turn a chunk of global indices into rows of a batch slot.

``fill_chunk`` is the whole per-sample job (read, decode, transform, check, place); the main
process runs it directly when ``workers=0`` and ``worker_main`` runs it in each worker process,
so both paths produce byte-identical batches. The protocol is the NOTE in ``_feed.py``.
A batch that carries fields takes its own loop (``_fill_fields``: ``_fields.fill_sample`` per
sample); the classification loop is untouched by them.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._core.seeding import SampleRngs
from stoker.codecs import JpegImage
from stoker.loader._fields import FieldViews, fill_sample
from stoker.loader._ring import RingLayout
from stoker.loader._shm import Mapping, SharedFd, populate, process_start_time
from stoker.loader._worker_errors import error_info
from stoker.loader.sources import Source
from stoker.pipeline import Pipeline
from stoker.transforms.mix import batch_rng

__all__ = ["PARK", "RING", "Task", "WorkerConfig", "fill_chunk", "worker_main"]

_THREAD_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)
_WATCHDOG_S = 0.5
try:  # a chunk's page faults, for its report (Linux)
    import resource

    _RUSAGE_THREAD: int | None = resource.RUSAGE_THREAD
except (ImportError, AttributeError):  # pragma: no cover - not Linux
    _RUSAGE_THREAD = None
# main -> a worker, besides tasks and None (see worker_main)
PARK = "park"
RING = "ring"


@dataclass(frozen=True)
class Task:
    """One chunk of one batch: what a worker receives (small: the indices are at most a batch)."""

    generation: int
    number: int
    slot: int
    epoch: int
    width: int | None
    rows: int  # rows of the whole batch (source samples; doubled with pair_with)
    row0: int  # first source-sample row of this chunk
    indices: np.ndarray  # global positions for rows row0 .. row0 + len(indices)
    half: int  # with pair_with: the offset of the paired rows (source samples in the batch)
    height: int | None = None  # the batch's height when it has its own (aspect-ratio buckets)
    # the loader's seed (a kept worker serves loaders of other seeds); None: the worker's own
    seed: int | None = None

    def __reduce__(self) -> tuple:
        # the indices as raw int64 bytes: pickling an ndarray costs several times more, once
        # per chunk, in the main process
        idx = np.ascontiguousarray(self.indices, dtype=np.int64).tobytes()
        return _task, (
            self.generation,
            self.number,
            self.slot,
            self.epoch,
            self.width,
            self.rows,
            self.row0,
            idx,
            self.half,
            self.height,
            self.seed,
        )


def _task(
    generation: int,
    number: int,
    slot: int,
    epoch: int,
    width: int | None,
    rows: int,
    row0: int,
    indices: bytes,
    half: int,
    height: int | None = None,
    seed: int | None = None,
) -> Task:
    idx = np.frombuffer(indices, dtype=np.int64)
    return Task(generation, number, slot, epoch, width, rows, row0, idx, half, height, seed)


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs, pickled once at start."""

    worker_id: int
    source: Source
    pipeline: Pipeline
    seed: int
    layout: RingLayout
    # the batch ring: a SharedFd (its descriptor goes with the worker's start) or, with the
    # portable engine, a NamedRing (its name); either maps with attach()
    ring: SharedFd | Any
    on_error: str
    main_pid: int
    main_start: int | None


# A chunk of at least this many samples computes their first draws at once
# (SampleRngs.first_blocks); that costs about a microsecond a sample at 128 and its fixed
# part outweighs re-keying a generator per sample below about 32.
FIRST_BLOCKS_FROM = 32


def fill_chunk(
    task: Task,
    *,
    source: Source,
    pipeline: Pipeline,
    seed: int,
    views: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    on_error: str,
    cancelled: Any = None,
    progress: Any = None,
    fields: FieldViews | None = None,
) -> tuple[str, Any]:
    """Process ``task`` into ``views`` (images, labels, keys, indices of the whole batch) and,
    when the batch carries fields, their columns ``fields``.

    Returns ``("done", bad)`` with ``bad`` a list of ``(row, index, key, reason)`` for samples
    that failed under ``on_error="skip"``, ``("error", info)`` for the first failure under
    ``on_error="raise"``, or ``("cancelled", None)`` when ``cancelled()`` became true.
    ``progress[0]`` (when given) is set to each sample's index before it is processed.
    """
    if fields is not None:
        return _fill_fields(
            task, source, pipeline, seed, views, fields, on_error, cancelled, progress
        )
    images, labels, keys, indices = views
    soft = None
    if pipeline.mix is not None:  # the classes in a column of their own, soft targets at the end
        soft, labels = labels, np.zeros(len(labels), np.int64)
    bad: list[tuple[int, int, int | None, str]] = []
    rngs = SampleRngs(seed, task.epoch)
    at = rngs.at  # sample_rng(seed, epoch, i), re-keyed in place
    read, width, ids = source.reader(task.indices), task.width, task.indices.tolist()
    row0, n = task.row0, len(task.indices)
    indices[row0 : row0 + n] = task.indices  # rows of skipped samples are dropped by main
    if task.half:
        indices[row0 + task.half : row0 + task.half + n] = task.indices
    for pipe, part in by_set(pipeline, source, task.indices):
        # the fused head straight into the row; fill_row takes whatever it declines
        fast = None if task.half else pipe.row_writer(width)
        fill_row, decode = pipe.fill_row, _decoder(source.encoded, pipe, fast is not None)
        # a head whose draws all come from the first block of a sample's stream takes them
        # from one computation for the chunk, not from a generator re-keyed per sample
        firsts: list = (
            rngs.first_blocks(task.indices[part]).tolist()
            if fast is not None and len(part) >= FIRST_BLOCKS_FROM and pipe.row_draws_first_block()
            else []
        )
        for j, k in enumerate(part.tolist()):
            row, gi = row0 + k, ids[k]
            if cancelled is not None and cancelled():
                return "cancelled", None
            if progress is not None:
                progress[0] = gi  # main reads it if this process dies
            try:
                payload, label, key, _ = read(gi)
                img = payload if decode is None else decode(payload)
                labels[row] = label
                keys[row] = key
                if firsts:
                    if fast(img, None, images[row], firsts[j]):  # type: ignore[misc]
                        continue
                    rng = at(gi)  # declined before any draw: the step-by-step path names why
                else:
                    rng = at(gi)
                    if fast is not None and fast(img, rng, images[row]):
                        continue
                # the sample is named in an error only: no message is formatted per sample
                if type(img) is JpegImage:  # one the row writer declined: decoded whole
                    img = np.asarray(img)
                out = fill_row(
                    img, rng, images[row], width, what="key {} (position {})", args=(key, gi)
                )
                if task.half:
                    assert out is not None  # fill_row returns the sample whenever pair_with is set
                    pair = pipe.check(
                        pipe.apply_pair(out, rng),
                        what="key {} (position {}), pair_with",
                        args=(key, gi),
                    )
                    r2 = row + task.half
                    pipe.place(pair, images[r2], width)
                    labels[r2] = label
                    keys[r2] = key
            except Exception as e:  # noqa: BLE001 - every failure is reported with its sample
                if on_error == "raise":
                    return "error", error_info(e, source, gi)
                bad.append(_skipped(source, gi, row, e))
    if soft is not None:
        _mix(task, pipeline, seed, images, labels, soft, bad)
    return "done", bad


def by_set(pipeline: Pipeline, source: Source, ids: np.ndarray) -> list[tuple[Pipeline, Any]]:
    """``(pipeline, positions in ids)`` of each chain: one for all, or with a mixture's chains
    per set (``Pipeline.per_set``) each set's, with the positions of its samples."""
    if not pipeline.per_set:
        return [(pipeline, np.arange(len(ids)))]
    sets = source.set_of(ids)  # type: ignore[attr-defined]
    return [(p, np.flatnonzero(sets == s)) for s, p in enumerate(pipeline.per_set)]


def _mix(
    task: Task,
    pipeline: Pipeline,
    seed: int,
    images: np.ndarray,
    classes: np.ndarray,
    soft: np.ndarray,
    bad: list,
) -> None:
    """The chunk's pairs of rows mixed in place and their soft targets written
    (``Loader(mix=...)``), from batch ``task.number``'s own generator."""
    assert pipeline.mix is not None
    pipeline.mix.mix_rows(
        images,
        classes,
        soft,
        range(task.row0, task.row0 + len(task.indices)),
        batch_rng(seed, task.epoch, task.number),
        chw=pipeline.layout == "NCHW",
        skip=frozenset(row for row, *_ in bad),
    )


def _decoder(encoded: bool | None, pipe: Pipeline, region: bool) -> Callable[[Any], Any] | None:
    """The decode of a source's images (``region``: for a row writer, ``Pipeline.decoder``):
    none for decoded arrays (``encoded=False``); per sample (``None``): an ndarray passes."""
    if encoded is False:
        return None
    decode = pipe.decoder(region)
    if encoded:
        return decode

    def per_sample(payload: Any) -> np.ndarray:
        return payload if isinstance(payload, np.ndarray) else decode(payload)

    return per_sample


def _skipped(source: Source, gi: int, row: int, e: Exception) -> tuple[int, int, int | None, str]:
    k = None
    try:
        k = int(source.key(gi))
    except Exception:  # noqa: BLE001
        pass
    return (row, int(gi), k, f"{type(e).__name__}: {e}")


def _fill_fields(
    task: Task,
    source: Source,
    pipeline: Pipeline,
    seed: int,
    views: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    fields: FieldViews,
    on_error: str,
    cancelled: Any,
    progress: Any,
) -> tuple[str, Any]:
    """``fill_chunk`` for a batch with fields: ``source.reader`` with the stored fields and
    ``_fields.fill_sample`` per sample (there is no ``pair_with`` here: the loader refuses it)."""
    images, labels, keys, indices = views
    plan = fields.plan
    bad: list[tuple[int, int, int | None, str]] = []
    at = SampleRngs(seed, task.epoch).at
    read = source.reader(task.indices, plan.stored)
    width, height, encoded = task.width, task.height, source.encoded
    row0, n = task.row0, len(task.indices)
    indices[row0 : row0 + n] = task.indices
    pipes = [pipeline] * n  # a mixture's chains per set: each sample's own
    if pipeline.per_set:
        for pipe, part in by_set(pipeline, source, task.indices):
            for k in part.tolist():
                pipes[k] = pipe
    for row, gi in enumerate(task.indices.tolist(), start=row0):
        if cancelled is not None and cancelled():
            return "cancelled", None
        if progress is not None:
            progress[0] = gi
        try:
            payload, label, key, vals = read(gi)
            fill_sample(
                plan,
                pipes[row - row0],
                payload,
                vals,
                at(gi),
                row,
                images,
                fields,
                width,
                height,
                encoded=encoded,
                key=key,
                gi=gi,
            )
            labels[row] = label
            keys[row] = key
        except Exception as e:  # noqa: BLE001 - every failure is reported with its sample
            if on_error == "raise":
                return "error", error_info(e, source, gi)
            bad.append(_skipped(source, gi, row, e))
    return "done", bad


# ---------------------------------------------------------------------------- process side
def _limit_threads() -> None:
    for name in _THREAD_ENV:
        os.environ[name] = "1"
    try:
        import cv2

        cv2.setNumThreads(1)
    except ImportError:  # pragma: no cover - cv2 is a dependency
        pass
    torch = sys.modules.get("torch")
    if torch is not None:  # a user transform may have pulled it in
        try:
            torch.set_num_threads(1)
        except Exception:  # noqa: BLE001
            pass


def _die_with_parent(main_pid: int, main_start: int | None) -> None:
    """PR_SET_PDEATHSIG on the direct parent plus a watchdog thread on the loader's process."""
    parent = os.getppid()
    try:
        from stoker._core.oscompat import libc

        libc().prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the watchdog below still works
        pass

    def watch() -> None:
        while True:
            if os.getppid() != parent or process_start_time(main_pid) != main_start:
                os._exit(1)
            time.sleep(_WATCHDOG_S)

    if os.getppid() != parent or process_start_time(main_pid) != main_start:
        os._exit(1)
    threading.Thread(target=watch, name="stoker-parent-watchdog", daemon=True).start()


def _watch_lifeline(lifeline: Any) -> None:
    """The portable engine's parent-death watch: main never writes to ``lifeline``, so the
    only thing it can ever report is EOF, when main's end closed with main. A thread blocks on
    it and ends this process then (``PR_SET_PDEATHSIG`` exists on Linux only)."""

    def watch() -> None:
        with contextlib.suppress(Exception):
            lifeline.poll(None)
        os._exit(1)

    threading.Thread(target=watch, name="stoker-lifeline", daemon=True).start()


class _Ring:
    """The batch ring as one worker sees it: its mapping, layout and control block, and the
    row ranges it has written (mapped) before. Replaced when a kept worker is handed another
    loader's ring."""

    def __init__(self, mapping: Any, layout: RingLayout, worker_id: int) -> None:
        self.mapping = mapping
        self.mem = mapping.array()
        self.layout = layout
        # the control block through a memoryview: read before every sample, where a NumPy
        # scalar read costs several times more
        self.control = memoryview(layout.control(self.mem).data)
        self.progress = self.control[1 + worker_id : 2 + worker_id]
        self.touched: set[tuple] = set()


def _received_ring(conn: Any, msg: tuple, worker_id: int) -> _Ring:
    """The ring a new loader hands a kept worker: ``(RING, layout, size)`` on the pipe, then
    its descriptor (``SCM_RIGHTS``), mapped here and closed; or, from the portable engine,
    ``(RING, layout, size, name)``: the segment mapped by name."""
    from multiprocessing.reduction import recv_handle

    if len(msg) > 3:
        from stoker.loader._named import NamedRing

        return _Ring(NamedRing(msg[3], msg[2]).attach(), msg[1], worker_id)
    fd = recv_handle(conn)
    try:
        mapping = Mapping(fd, msg[2], writable=True)
    finally:
        os.close(fd)
    return _Ring(mapping, msg[1], worker_id)


def worker_main(cfg: WorkerConfig, conn: Any, lifeline: Any = None) -> None:
    """Serve tasks from ``conn`` until ``None``, EOF (the main process is gone) or a signal.
    ``PARK`` closes the source (a kept, idle worker); ``(RING, layout, size)`` and a
    descriptor hand it another ring, which replaces the one it maps. ``lifeline``: the
    portable engine's pipe from main (``_watch_lifeline``), in place of the Linux watch."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's business
    # SIGUSR1 prints this worker's Python stack on stderr (the stall watchdog of stoker.watch
    # asks for it through Loader.worker_pids()); the worker carries on afterwards.
    if hasattr(signal, "SIGUSR1"):  # not on Windows
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    _limit_threads()
    if lifeline is None:
        _die_with_parent(cfg.main_pid, cfg.main_start)
    else:
        _watch_lifeline(lifeline)
    wid = cfg.worker_id
    ring: _Ring | None = _Ring(cfg.ring.attach(writable=True), cfg.layout, wid)  # fd closed
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            break
        if task is None:
            break
        if not isinstance(task, Task):
            if task == PARK:
                with contextlib.suppress(Exception):
                    cfg.source.close()  # reopens on the next read
            else:
                ring = None  # the old one is unmapped with its last view
                ring = _received_ring(conn, task, wid)
            continue
        assert ring is not None, "a task before any ring"
        if not _serve(cfg, conn, task, ring):
            break
    try:
        cfg.source.close()
    except Exception:  # noqa: BLE001
        pass


def _faults() -> int:
    """This thread's minor page faults so far (0 where ``RUSAGE_THREAD`` is missing)."""
    return resource.getrusage(_RUSAGE_THREAD).ru_minflt if _RUSAGE_THREAD is not None else 0


def _serve(cfg: WorkerConfig, conn: Any, task: Task, ring: _Ring) -> bool:
    """One task into ``ring`` and its report to main; False when main is gone."""
    gen, control, progress, layout, mem = (
        task.generation,
        ring.control,
        ring.progress,
        ring.layout,
        ring.mem,
    )

    def cancelled(gen: int = gen) -> bool:
        return control[0] != gen

    views = layout.views(mem, task.slot, task.width, task.rows, task.height)
    fviews = layout.field_views(mem, task.slot, task.width, task.rows, task.height)
    where = (
        task.slot,
        task.width,
        task.height,
        task.rows,
        task.row0,
        len(task.indices),
        task.half,
    )
    mapped = 0.0
    if where not in ring.touched:  # first write there: map its pages in one call
        ring.touched.add(where)
        t = time.thread_time()
        for r0 in (task.row0, task.row0 + task.half) if task.half else (task.row0,):
            populate(views[0][r0 : r0 + len(task.indices)])
        mapped = time.thread_time() - t
    began, cpu, faults = time.perf_counter(), time.thread_time(), _faults()
    try:
        status, payload = fill_chunk(
            task,
            source=cfg.source,
            pipeline=cfg.pipeline,
            seed=cfg.seed if task.seed is None else task.seed,
            views=views,
            on_error=cfg.on_error,
            cancelled=cancelled,
            progress=progress,
            fields=fviews,
        )
    except BaseException as e:  # noqa: BLE001 - never die silently
        status, payload = "error", error_info(e, cfg.source, int(task.indices[0]))
    seconds = time.perf_counter() - began
    usage = (time.thread_time() - cpu, _faults() - faults, mapped)
    del views, fviews
    progress[0] = -1
    try:
        conn.send((status, gen, task.number, task.row0, payload, seconds, usage))
    except (BrokenPipeError, OSError):
        return False
    return True
