"""``stoker.pack``: an image folder or im2rec list → RecordIO shards, a manifest, a rejects list.

NOTE [ Packer processes, order and shutdown ]

Who does what
    The main process lists the input once (a snapshot, see ``scan.py``), decides the order
    (sorted, or a seeded shuffle) and therefore every record's key and shard before any image
    is read. Worker processes (a ``ProcessPoolExecutor`` on the ``forkserver`` context) read and
    check chunks of files and send back the bytes to store, or a reject verdict. Nothing but
    small frozen task objects, bytes and tuples crosses the process boundary.

Order
    Chunks are submitted in order and collected in the same order; at most ``4 * workers``
    chunks are in flight (a bounded reorder window). The main process alone writes, so the
    output bytes do not depend on ``workers``.

Keys
    For an image folder the key of a file is its position in the (sorted or shuffled) list of
    candidate image files; a file rejected while checking leaves a gap. For an im2rec list the
    key is the list's index column, as im2rec does. Shard ``s`` (``shard_size=N``) holds
    positions ``[s*N, (s+1)*N)``, so rejects make shards slightly short.

Files
    Every output is written as ``*.partial`` and renamed only when the whole run succeeded:
    the shards (``.rec``/``.idx``/``.crc32c``), ``.stoker.json`` (written last), ``.rejects.tsv``
    and ``.lst``. A journal ``OUT.pack-journal.partial`` holds the plan's fingerprint and
    ``OUT.rejects.tsv.partial`` the rejects found so far (one flushed line each).

Resume
    With ``resume=True`` a rerun whose plan (input list, labels, settings) has the same
    fingerprint reopens the partial shards (``RecordWriter(resume=True)`` keeps every complete
    record and cuts the torn tail). Every position up to the last record kept was decided by
    the earlier run (written, or rejected and journalled); the run continues after it. A
    different plan starts over.

Worker faults
    A worker that dies (segfault, OOM kill) breaks the pool. Chunks that had not finished are
    retried item by item, each alone in a fresh one-worker pool; an item that kills that
    worker too is rejected ``decoder_crash``. Then a fresh pool carries on. Nothing already
    decided is lost.

Shutdown
    Normal end: pool shut down (workers joined), partials committed in order shards → lists →
    manifest, journal removed. Exception or Ctrl-C (``KeyboardInterrupt``) or ``SystemExit``
    from a SIGTERM handler: pending chunks cancelled, workers terminated and joined, partials
    flushed and kept for a resume, the exception propagates. Write errors (ENOSPC, EFBIG) name
    the output path and remove the partials. SIGKILL of the main process: each worker watches
    the main process (a pidfd) and exits when it is gone, and then the forkserver exits too
    (``_procs.py``); the partials stay for a resume. Workers ignore SIGINT (the main process
    decides).

Timeouts
    None: a worker is only ever waited on while it is alive; a worker stuck forever in a
    decoder would stall the run (no such case is known for libjpeg-turbo or Pillow with the
    limits set here).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._core.atomic import atomic_write, partial_path
from stoker._core.errors import OutputExistsError, PackError, TooManyRejectsError
from stoker._core.progress import Progress, make_progress
from stoker._core.seeding import stream_rng
from stoker.pack._procs import pool_context, worker_init
from stoker.pack.images import Reject, check_image
from stoker.pack.scan import Item, ScanResult, escape_name, read_lst, scan_folder

__all__ = ["PackReport", "output_prefix", "pack"]

_MAX_FILE_BYTES = (1 << 29) - 1 - 24 - 4 * 64  # RecordIO record limit less header and labels
_DOMAIN_SHUFFLE = 0x50414B53  # "PAKS"
_JOURNAL_VERSION = 1
_FLUSH_EVERY_S = 0.1


# ---------------------------------------------------------------------------- worker side


@dataclass(frozen=True)
class _Options:
    """What a worker needs to check one file (frozen, picklable)."""

    max_pixels: int
    resize: int | None
    quality: int | None
    check: Callable[..., Any] = check_image


@dataclass(frozen=True)
class _Task:
    paths: tuple[str, ...]
    options: _Options


def _init_worker(main_pid: int) -> None:
    """Worker start: Ctrl-C is the main process's business; exit when it dies (``_procs``)."""
    worker_init(main_pid)
    from PIL import Image, ImageFile

    Image.MAX_IMAGE_PIXELS = None  # check_image applies max_pixels from the header itself
    ImageFile.LOAD_TRUNCATED_IMAGES = False


def _read_file(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise Reject("vanished", "no longer exists (removed after the listing)") from None
    except PermissionError as e:
        raise Reject("EACCES", e.strerror or "permission denied") from None
    except OSError as e:
        raise Reject(
            "unreadable", f"{errno.errorcode.get(e.errno or 0, e.errno)}: {e.strerror}"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Reject("not_a_file", "not a regular file")
        if st.st_size > _MAX_FILE_BYTES:
            raise Reject(
                "too_large", f"{st.st_size} bytes; a RecordIO record holds at most 2^29-1 bytes"
            )
        with os.fdopen(fd, "rb", closefd=True) as f:
            fd = -1
            return f.read()
    except Reject:
        raise
    except OSError as e:
        raise Reject(
            "unreadable", f"{errno.errorcode.get(e.errno or 0, e.errno)}: {e.strerror}"
        ) from None
    finally:
        if fd >= 0:
            os.close(fd)


def _process(path: str, options: _Options) -> tuple:
    try:
        data = _read_file(path)
        got = options.check(
            data, max_pixels=options.max_pixels, resize=options.resize, quality=options.quality
        )
    except Reject as r:
        return (1, r.reason, r.detail)
    except MemoryError:
        return (1, "out_of_memory", "decoding ran out of memory")
    except Exception as e:  # noqa: BLE001 - one bad file must not stop the run
        return (1, "undecodable", f"{type(e).__name__}: {e}")
    return (0, got.payload, got.source_format, got.rotated, got.passthrough, len(data))


def _process_task(task: _Task) -> list[tuple]:
    return [_process(p, task.options) for p in task.paths]


# ---------------------------------------------------------------------------- report


@dataclass(frozen=True)
class PackReport:
    """What a pack run did. ``written + rejected + ignored == found``."""

    found: int
    written: int
    rejected: int
    ignored: int
    classes: dict[str, int]
    reasons: dict[str, int]
    bytes_in: int
    bytes_out: int
    seconds: float
    passthrough: int
    reencoded: int
    resumed: int
    manifest: str
    shards: tuple[str, ...]
    rejects_path: str
    list_path: str | None = None
    ignored_links: int = 0
    unclassified: int = 0
    formats: dict[str, int] = field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return (self.written - self.resumed) / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_in / 1e6 / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """A few human lines: counts, sizes, rates, where the rejects are listed."""
        lines = [
            f"packed {self.written} images ({self.bytes_out / 1e6:.1f} MB in "
            f"{len(self.shards)} shard{'s' if len(self.shards) != 1 else ''}) "
            f"in {self.seconds:.1f} s: {self.images_per_s:.0f} images/s, "
            f"{self.mb_per_s:.1f} MB/s read",
            f"found {self.found}: written {self.written}, rejected {self.rejected}, "
            f"ignored {self.ignored}; classes {len(self.classes)}; "
            f"stored as is {self.passthrough}, re-encoded {self.reencoded}",
        ]
        if self.resumed:
            lines.append(f"resumed: {self.resumed} records kept from an interrupted run")
        if self.ignored_links:
            lines.append(
                f"{self.ignored_links} symlinked folder(s) not followed (follow_symlinks=True)"
            )
        if self.unclassified:
            lines.append(f"{self.unclassified} file(s) directly under the source folder ignored")
        if self.rejected:
            why = ", ".join(f"{k} {v}" for k, v in sorted(self.reasons.items()))
            lines.append(f"rejected {self.rejected} ({why}): see {self.rejects_path}")
        lines.append(f"manifest: {self.manifest}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- planning


def output_prefix(out: str | os.PathLike[str]) -> str:
    """``OUT`` from ``OUT``, ``OUT.rec`` or ``OUT.stoker.json``."""
    s = os.fspath(out)
    for suffix in (".stoker.json", ".rec"):
        if s.endswith(suffix):
            return s[: -len(suffix)]
    return s


@dataclass
class _Plan:
    items: list[Item]
    keys: np.ndarray  # int64, by position
    shard_size: int | None
    prefix: str

    @property
    def n_shards(self) -> int:
        if self.shard_size is None:
            return 1
        return max(1, -(-len(self.items) // self.shard_size))

    def shard_of(self, pos: int) -> int:
        return 0 if self.shard_size is None else pos // self.shard_size

    def rec_path(self, s: int) -> str:
        if self.shard_size is None:
            return self.prefix + ".rec"
        return f"{self.prefix}-{s:05d}.rec"


def _fingerprint(plan: _Plan, settings: dict) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode())
    for key, it in zip(plan.keys.tolist(), plan.items):
        h.update(f"{key}\t{it.label!r}\t".encode())
        h.update(os.fsencode(it.path))
        h.update(b"\n")
    return h.hexdigest()


def _stem_paths(rec: str) -> tuple[str, str, str]:
    stem = rec[:-4]
    return rec, stem + ".idx", stem + ".crc32c"


def _header_payload(key: int, label: float | tuple[float, ...], data: bytes) -> bytes:
    from stoker.formats.recordio import IRHeader, pack_header

    if isinstance(label, tuple):
        return pack_header(IRHeader(len(label), np.asarray(label, np.float32), key, 0), data)
    return pack_header(IRHeader(0, float(label), key, 0), data)


# ---------------------------------------------------------------------------- the run


class _Pool:
    """A process pool that can be replaced after a worker died, and torn down for sure."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None

    def get(self) -> ProcessPoolExecutor:
        if self.pool is None:
            self.pool = ProcessPoolExecutor(
                self.workers,
                mp_context=pool_context(),
                initializer=_init_worker,
                initargs=(os.getpid(),),
            )
        return self.pool

    def close(self, *, grace: float = 30.0) -> None:
        """Stop the pool: queued chunks are cancelled, workers finish the chunk they hold
        (a fraction of a second) and exit; a worker still busy after ``grace`` seconds is
        terminated. (Terminating first can leave the executor's queue feeder blocked on a
        pipe nobody reads, and its shutdown hanging.)"""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        if manager is not None:
            manager.join(grace)
            if manager.is_alive():
                for p in procs:
                    with contextlib.suppress(Exception):
                        p.terminate()
                manager.join(10)
        for p in procs:
            with contextlib.suppress(Exception):
                p.join(5)


def _chunks(n: int, size: int, start: int = 0) -> Generator[tuple[int, int], None, None]:
    for a in range(start, n, size):
        yield a, min(n, a + size)


def _isolate(paths: Sequence[str], options: _Options) -> list[tuple]:
    """Run each path alone in a one-worker pool; a path that kills it is ``decoder_crash``."""
    out: list[tuple] = []
    single = _Pool(1)
    try:
        for p in paths:
            try:
                out.append(single.get().submit(_process_task, _Task((p,), options)).result()[0])
            except BrokenProcessPool:
                single.close()
                out.append((1, "decoder_crash", "the worker process died twice on this file"))
    finally:
        single.close()
    return out


class _NotSubmitted(Exception):
    """Internal: the pool was already broken when this chunk was handed to it."""


def _results(
    plan: _Plan, start: int, options: _Options, workers: int, chunk: int
) -> Generator[tuple[int, tuple], None, None]:
    """(position, result) for positions ``start..`` in order, from a pool of workers."""
    pool = _Pool(workers)
    window = 4 * workers
    todo = _chunks(len(plan.items), chunk, start)
    retry: collections.deque[tuple[int, int]] = collections.deque()
    pending: collections.deque[tuple[int, int, Future]] = collections.deque()

    def submit() -> bool:
        nxt = retry.popleft() if retry else next(todo, None)
        if nxt is None:
            return False
        a, b = nxt
        paths = tuple(it.path for it in plan.items[a:b])
        try:
            fut = pool.get().submit(_process_task, _Task(paths, options))
        except BrokenProcessPool:
            fut = Future()
            fut.set_exception(_NotSubmitted())
        pending.append((a, b, fut))
        return True

    try:
        while len(pending) < window and submit():
            pass
        while pending:
            a, b, fut = pending[0]
            try:
                res = fut.result()
            except (BrokenProcessPool, _NotSubmitted):
                # a worker died: keep what finished, retry what ran one file at a time,
                # and hand what never ran to a fresh pool
                entries = list(pending)
                pending.clear()
                pool.close()
                for a2, b2, f2 in entries:
                    exc = f2.exception()
                    if isinstance(exc, _NotSubmitted):
                        retry.append((a2, b2))
                        continue
                    r2 = f2.result() if exc is None else None
                    if r2 is None:
                        r2 = _isolate([it.path for it in plan.items[a2:b2]], options)
                    for i, r in enumerate(r2):
                        yield a2 + i, r
                while len(pending) < window and submit():
                    pass
                continue
            pending.popleft()
            submit()
            for i, r in enumerate(res):
                yield a + i, r
    finally:
        pool.close()


def _scan(src: str, *, follow_symlinks: bool, root: str | None) -> tuple[ScanResult, bool]:
    if os.path.isdir(src):
        return scan_folder(src, follow_symlinks=follow_symlinks), False
    if os.path.isfile(src) and src.endswith(".lst"):
        return read_lst(src, root=root), True
    if not os.path.exists(src):
        raise PackError(f"{src}: no such file or folder")
    raise PackError(f"{src}: give an image folder or an im2rec .lst file")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _check_int(name: str, value: Any, lo: int, *, none_ok: bool = True) -> None:
    if value is None and none_ok:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(
            f"{name} must be an int >= {lo}{' or None' if none_ok else ''}, got {value!r}"
        )


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    workers: int | None = None,
    resize: int | None = None,
    quality: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    shard_size: int | None = None,
    list_file: bool = False,
    overwrite: bool = False,
    resume: bool = True,
    max_rejects: int | None = None,
    max_pixels: int = 89_478_485,
    follow_symlinks: bool = False,
    root: str | os.PathLike[str] | None = None,
    progress: bool | None = None,
    _check: Callable[..., Any] | None = None,
) -> PackReport:
    """Pack an image folder (one class per top-level subfolder) or an im2rec ``.lst`` into
    ``OUT.rec``/``OUT.idx`` (``OUT-NNNNN.*`` with ``shard_size``), ``OUT.crc32c``,
    ``OUT.stoker.json``, ``OUT.rejects.tsv`` and, with ``list_file``, ``OUT.lst``.

    ``workers``: processes (default: all cores). ``resize``: shorter side in pixels;
    ``quality``: JPEG quality; either re-encodes every image (default: original JPEG bytes are
    kept). ``shuffle``/``seed``: a seeded order. ``max_rejects``: raise
    :class:`TooManyRejectsError` when more files are rejected (after writing the rejects file).
    ``max_pixels``: header pixel limit (decompression bombs). ``root``: folder that ``.lst``
    paths are relative to (default: the list's folder). ``progress``: a bar on stderr (default:
    when stderr is a terminal). ``_check``: internal, a module-level stand-in for
    ``check_image`` run in the workers (fault-injection tests). See ``docs/pack.md`` for the
    checks, the normalisation policy and resume.
    """
    t0 = time.perf_counter()
    src = os.fspath(src)
    _check_int("workers", workers, 1)
    _check_int("resize", resize, 1)
    _check_int("shard_size", shard_size, 1)
    _check_int("max_rejects", max_rejects, 0)
    _check_int("max_pixels", max_pixels, 1, none_ok=False)
    _check_int("seed", seed, 0, none_ok=False)
    if quality is not None:
        _check_int("quality", quality, 1, none_ok=False)
        if quality > 100:
            raise ValueError(f"quality must be in 1..100, got {quality}")
    n_workers = workers or _cpu_count()
    prefix = output_prefix(out)
    if not prefix or os.path.isdir(prefix):
        raise ValueError(f"out must name a file prefix (e.g. data/train), got {os.fspath(out)!r}")
    out_dir = os.path.dirname(os.path.abspath(prefix))
    if not os.path.isdir(out_dir):
        raise PackError(f"{out_dir}: output folder does not exist")
    if not os.access(out_dir, os.W_OK):
        raise PackError(f"{out_dir}: output folder is not writable")

    scan, from_lst = _scan(
        src, follow_symlinks=follow_symlinks, root=os.fspath(root) if root else None
    )
    items = scan.items
    if shuffle:
        perm = stream_rng(seed, _DOMAIN_SHUFFLE, len(items)).permutation(len(items))
        items = [items[i] for i in perm]
    if from_lst:
        keys = np.asarray([it.key for it in items], dtype=np.int64)
    else:
        keys = np.arange(len(items), dtype=np.int64)
    plan = _Plan(items, keys, shard_size, prefix)
    manifest_path = prefix + ".stoker.json"
    rejects_path = prefix + ".rejects.tsv"
    list_path = prefix + ".lst" if list_file else None
    shard_recs = [plan.rec_path(s) for s in range(plan.n_shards)]
    finals = [p for rec in shard_recs for p in _stem_paths(rec)]
    finals += [manifest_path, rejects_path] + ([list_path] if list_path else [])
    options = _Options(max_pixels, resize, quality, _check or check_image)
    settings = {
        "journal": _JOURNAL_VERSION,
        "resize": resize,
        "quality": quality,
        "shuffle": bool(shuffle),
        "seed": int(seed),
        "shard_size": shard_size,
        "max_pixels": int(max_pixels),
        "check": f"{options.check.__module__}.{options.check.__qualname__}",
    }
    fp = _fingerprint(plan, settings)
    journal = prefix + ".pack-journal.partial"
    rej_journal = partial_path(rejects_path)
    same_plan = False  # a journal says an unfinished run of this very plan left files here
    if os.path.exists(journal):
        try:
            with open(journal) as f:
                same_plan = json.load(f).get("fingerprint") == fp
        except (OSError, ValueError):
            same_plan = False
    if not overwrite and not same_plan:
        # a rejects list alone is what a run stopped by max_rejects leaves: not in the way
        existing = [
            p
            for p in finals
            if os.path.exists(p) and (p != rejects_path or os.path.exists(manifest_path))
        ]
        if existing:
            raise OutputExistsError(
                f"{existing[0]} exists ({len(existing)} output file(s) in the way); "
                "pass overwrite=True (--overwrite) to replace them"
            )
    # a run killed while committing has renamed some shards already: start over then
    committed_some = any(
        os.path.exists(rec) and not os.path.exists(partial_path(rec)) for rec in shard_recs
    )
    resuming = resume and same_plan and not committed_some
    if not resuming:
        _remove_partials(shard_recs, rej_journal, journal)
        with atomic_write(journal, "w") as jf:
            json.dump({"fingerprint": fp, "settings": settings}, jf)

    writers: dict[int, Any] = {}
    reasons: collections.Counter[str] = collections.Counter()
    formats: collections.Counter[str] = collections.Counter()
    item_rejects: list[tuple[int, str, str]] = []  # (position, reason, detail)
    written_mask = np.zeros(len(items), dtype=bool)
    counters = {"bytes_in": 0, "passthrough": 0, "reencoded": 0, "exif_rotated": 0}
    start = 0
    resumed = 0

    from stoker.formats.recordio import RecordWriter

    def writer(s: int) -> Any:
        w = writers.get(s)
        if w is None:
            w = RecordWriter(shard_recs[s], overwrite=True, resume=resuming, checksums=True)
            writers[s] = w
        return w

    pos_of_key: dict[int, int] | None = None
    if resuming:
        pos_of_key = {k: i for i, k in enumerate(keys.tolist())} if from_lst else None
        last = -1
        for s, rec in enumerate(shard_recs):
            if os.path.exists(partial_path(rec)):
                kw = writer(s).keys_written
                pos = kw if pos_of_key is None else np.asarray([pos_of_key[k] for k in kw.tolist()])
                if len(pos):
                    written_mask[pos] = True
                    last = max(last, int(pos.max()))
        start = last + 1
        resumed = int(written_mask.sum())
        for pos, reason, detail in _read_reject_journal(rej_journal):
            if pos < start:
                item_rejects.append((pos, reason, detail))
        _rewrite_reject_journal(rej_journal, item_rejects)
    rej_f = open(rej_journal, "a", encoding="utf-8", newline="\n")  # noqa: SIM115

    bar: Progress = make_progress(len(items), "pack", unit="img", enabled=progress)
    bar.update(start)
    committed = False
    chunk = max(1, min(64, len(items) // (n_workers * 8) or 1))
    last_flush = time.monotonic()
    stream = _results(plan, start, options, n_workers, chunk)
    try:
        for pos, r in stream:
            it = items[pos]
            if r[0] == 0:
                _, data, fmt, rotated, passthrough, size_in = r
                key = int(keys[pos])
                payload = _header_payload(key, it.label, data)
                if len(payload) > _MAX_FILE_BYTES + 24:
                    r = (
                        1,
                        "too_large",
                        f"{len(payload)} bytes after encoding exceed RecordIO's limit",
                    )
                else:
                    s = plan.shard_of(pos)
                    w = writer(s)
                    try:
                        w.write(key, payload)
                    except OSError as e:
                        raise _write_error(e, w.rec_path, w.bytes_written) from None
                    written_mask[pos] = True
                    formats[fmt] += 1
                    counters["bytes_in"] += size_in
                    counters["passthrough" if passthrough else "reencoded"] += 1
                    counters["exif_rotated"] += int(rotated)
            if r[0] == 1:
                _, reason, detail = r
                item_rejects.append((pos, reason, detail))
                reasons[reason] += 1
                try:
                    rej_f.write(f"{pos}\t{reason}\t{escape_name(detail)}\n")
                    rej_f.flush()
                except OSError as e:
                    raise _write_error(e, rej_journal, None) from None
                n_rej = len(item_rejects) + len(scan.rejects)
                bar.set_postfix_str(f"rejected {n_rej}")
                if max_rejects is not None and n_rej > max_rejects:
                    rej_f.close()
                    _write_rejects(rejects_path, scan, plan, item_rejects)
                    raise TooManyRejectsError(
                        f"{n_rej} files rejected, more than max_rejects={max_rejects}; "
                        f"see {rejects_path} (partial output kept; rerun to resume)"
                    )
            bar.update(1)
            now = time.monotonic()
            if now - last_flush > _FLUSH_EVERY_S:  # bound the work a kill can lose
                last_flush = now
                for w in writers.values():
                    try:
                        w.flush()
                    except OSError as e:
                        raise _write_error(e, w.rec_path, w.bytes_written) from None
        bar.close()
        rej_f.close()
        # finish: shards, lists, manifest (last), then drop the journal
        shard_infos = []
        for s in range(plan.n_shards):
            w = writer(s)
            try:
                shard_infos.append(w.commit())
            except OSError as e:
                raise _write_error(e, w.rec_path, w.bytes_written) from None
        try:
            _write_rejects(rejects_path, scan, plan, item_rejects)
            if list_path:
                _write_lst(list_path, plan, written_mask)
        except OSError as e:
            raise _write_error(e, rejects_path if not list_path else list_path, None) from None
        all_reasons = collections.Counter(r for _, r, _ in scan.rejects)
        all_reasons.update(r for _, r, _ in item_rejects)
        written = int(written_mask.sum())
        rejected = len(scan.rejects) + len(item_rejects)
        pack_meta = {
            "source": os.path.basename(os.path.normpath(src)),
            "source_kind": "lst" if from_lst else "folder",
            "keys": "lst-index" if from_lst else "position",
            "resize": resize,
            "quality": quality,
            "shuffle": bool(shuffle),
            "seed": int(seed),
            "shard_size": shard_size,
            "max_pixels": int(max_pixels),
            "follow_symlinks": bool(follow_symlinks),
            "found": scan.found,
            "written": written,
            "ignored": scan.ignored,
            "passthrough": counters["passthrough"],
            "reencoded": counters["reencoded"],
            "exif_rotated": counters["exif_rotated"],
            "formats": dict(sorted(formats.items())),
            "class_counts": _class_counts(scan, plan, written_mask) if not from_lst else {},
        }
        rejects_meta = {
            "count": rejected,
            "reasons": dict(sorted(all_reasons.items())),
            "file": os.path.basename(rejects_path),
        }
        _write_manifest(manifest_path, shard_infos, scan.classes, pack_meta, rejects_meta)
        committed = True
        with contextlib.suppress(FileNotFoundError):
            os.unlink(journal)
        bar_total = written + rejected + scan.ignored
        if bar_total != scan.found:  # pragma: no cover - an accounting bug, never a user error
            raise PackError(
                f"internal accounting error: written {written} + rejected {rejected} + "
                f"ignored {scan.ignored} != found {scan.found}"
            )
        return PackReport(
            found=scan.found,
            written=written,
            rejected=rejected,
            ignored=scan.ignored,
            classes=dict(scan.classes),
            reasons=dict(sorted(all_reasons.items())),
            bytes_in=counters["bytes_in"],
            bytes_out=sum(si.rec_bytes for si in shard_infos),
            seconds=time.perf_counter() - t0,
            passthrough=counters["passthrough"],
            reencoded=counters["reencoded"],
            resumed=resumed,
            manifest=manifest_path,
            shards=tuple(si.rec for si in shard_infos),
            rejects_path=rejects_path,
            list_path=list_path,
            ignored_links=scan.ignored_links,
            unclassified=scan.unclassified,
            formats=dict(sorted(formats.items())),
        )
    except _WriteFailed as e:
        for w in writers.values():
            w.abort(keep_partial=False)
        _remove_partials(shard_recs, rej_journal, journal)
        raise e.error from None
    except BaseException:
        if not committed:
            for w in writers.values():
                with contextlib.suppress(Exception):
                    w.abort(keep_partial=True)
        raise
    finally:
        stream.close()  # stops and joins the workers if we leave early
        bar.close()
        with contextlib.suppress(Exception):
            rej_f.close()


class _WriteFailed(Exception):
    def __init__(self, error: PackError) -> None:
        self.error = error
        super().__init__(str(error))


def _write_error(e: OSError, path: str, nbytes: int | None) -> _WriteFailed:
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    done = f" after {nbytes} bytes" if nbytes is not None else ""
    hint = " (disk full?)" if e.errno == errno.ENOSPC else ""
    hint = " (file size limit)" if e.errno == errno.EFBIG else hint
    err = PackError(
        f"writing {path} failed{done}: {name} {e.strerror}{hint}; partial output removed"
    )
    err.__cause__ = e
    return _WriteFailed(err)


def _remove_partials(shard_recs: list[str], rej_journal: str, journal: str) -> None:
    for rec in shard_recs:
        for p in _stem_paths(rec):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial_path(p))
    for p in (rej_journal, journal):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def _read_reject_journal(path: str) -> list[tuple[int, str, str]]:
    from stoker.pack.scan import unescape_name

    out = []
    try:
        with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # torn last line
                parts = line[:-1].split("\t")
                if len(parts) == 3 and parts[0].isdigit():
                    out.append((int(parts[0]), parts[1], unescape_name(parts[2])))
    except FileNotFoundError:
        pass
    return out


def _rewrite_reject_journal(path: str, rows: list[tuple[int, str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for pos, reason, detail in rows:
            f.write(f"{pos}\t{reason}\t{escape_name(detail)}\n")


def _write_rejects(
    path: str, scan: ScanResult, plan: _Plan, item_rejects: list[tuple[int, str, str]]
) -> None:
    """``key path reason detail`` per rejected file (key empty when rejected while listing);
    names escaped (see ``scan.escape_name``)."""
    with atomic_write(path, "w") as f:
        f.write("key\tpath\treason\tdetail\n")
        for rel, reason, detail in scan.rejects:
            f.write(f"\t{escape_name(rel)}\t{reason}\t{escape_name(detail)}\n")
        for pos, reason, detail in sorted(item_rejects):
            rel = plan.items[pos].rel
            f.write(f"{plan.keys[pos]}\t{escape_name(rel)}\t{reason}\t{escape_name(detail)}\n")


def _write_lst(path: str, plan: _Plan, written: np.ndarray) -> None:
    """im2rec list: ``key \\t label(s) \\t path`` for every record, in record order."""
    with atomic_write(path, "w") as f:
        for pos in np.flatnonzero(written).tolist():
            it = plan.items[pos]
            labels = it.label if isinstance(it.label, tuple) else (it.label,)
            lab = "\t".join(f"{v:f}" for v in labels)
            f.write(f"{plan.keys[pos]}\t{lab}\t{escape_name(it.rel)}\n")


def _class_counts(scan: ScanResult, plan: _Plan, written: np.ndarray) -> dict[str, int]:
    counts = np.zeros(len(scan.classes), dtype=np.int64)
    for pos in np.flatnonzero(written).tolist():
        lab = plan.items[pos].label
        if not isinstance(lab, tuple) and 0 <= int(lab) < len(counts):
            counts[int(lab)] += 1
    return {name: int(counts[i]) for name, i in scan.classes.items()}


def _write_manifest(
    path: str, shard_infos: list, classes: dict[str, int], pack_meta: dict, rejects_meta: dict
) -> None:
    from stoker.formats.recordio.manifest import make_manifest, shard_entry, write_manifest

    shards = [shard_entry(si, path) for si in shard_infos]
    write_manifest(
        path, make_manifest(shards, classes=classes, pack=pack_meta, rejects=rejects_meta)
    )
