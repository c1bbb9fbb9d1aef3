"""The doctor's measurements: each stage of the input pipeline, timed on this machine.

Every measurement runs one stage on a bounded sample of the real data for about ``seconds``
and returns a :class:`Stage`: samples per second, wall and CPU time per sample (CPU time via
``time.thread_time``, so a stage that sleeps or waits on I/O shows a low CPU share), bytes
per second when bytes are what moves.

Cold reads: the page cache cannot be dropped without root, but a process may ask the kernel
to evict the clean pages of a file it can open (``posix_fadvise(POSIX_FADV_DONTNEED)``). The
cold pass does that for each sampled file (or record range) just before reading it, so it reads
from the device when the kernel honours the request. On tmpfs or some network filesystems it
does not; the report says so when cold and warm come out alike.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "IMAGE_EXTENSIONS",
    "SourceSample",
    "Stage",
    "decoders",
    "evict",
    "measure_assemble",
    "measure_decode",
    "measure_loader",
    "measure_read_files",
    "measure_read_packed",
    "measure_read_records",
    "measure_transforms",
    "sample_source",
    "time_loop",
]

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif", ".ppm", ".pgm"}
)


@dataclass(frozen=True)
class Stage:
    """One measured stage. ``rate`` is samples/s with one process doing the work."""

    name: str  # e.g. "read files (cold)", "decode simplejpeg"
    stage: str  # storage | decode | augment | loader | host-to-device | model
    samples: int
    seconds: float
    cpu_seconds: float
    nbytes: int = 0
    note: str = ""
    queue_seconds: float = 0.0  # runnable but waiting for a core (other processes had it)

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else float("inf")

    @property
    def per_sample_s(self) -> float:
        return self.seconds / self.samples if self.samples else 0.0

    @property
    def cpu_per_sample_s(self) -> float:
        return self.cpu_seconds / self.samples if self.samples else 0.0

    @property
    def queue_per_sample_s(self) -> float:
        return self.queue_seconds / self.samples if self.samples else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "rate": self.rate,
            "per_sample_ms": 1e3 * self.per_sample_s,
            "cpu_per_sample_ms": 1e3 * self.cpu_per_sample_s,
            "queue_per_sample_ms": 1e3 * self.queue_per_sample_s,
            "mb_per_s": self.bytes_per_s / 1e6,
            "samples": self.samples,
            "seconds": self.seconds,
            "note": self.note,
        }


def run_delay() -> float:
    """Seconds this thread has spent runnable but waiting for a core (Linux schedstat; 0
    elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def time_loop(
    fn: Callable[[Any], object],
    items: Sequence[Any],
    *,
    seconds: float,
    min_items: int = 1,
    max_items: int | None = None,
    cycle: bool = True,
) -> tuple[int, float, float, float]:
    """Call ``fn`` on ``items`` (cycling when ``cycle``) for about ``seconds``.

    Returns ``(calls, wall s, thread CPU s, run-queue wait s)``. Stops after ``max_items``
    calls, or at the end of ``items`` when not cycling; runs at least ``min_items`` calls.
    """
    if not items:
        return 0, 0.0, 0.0, 0.0
    limit = max_items if max_items is not None else (1 << 62)
    if not cycle:
        limit = min(limit, len(items))
    clock, cpu = time.perf_counter, time.thread_time
    n = 0
    q0 = run_delay()
    c0 = cpu()
    t0 = clock()
    deadline = t0 + seconds
    m = len(items)
    while n < limit:
        fn(items[n % m])
        n += 1
        if n >= min_items and (n & 7 == 0 or n < 8) and clock() >= deadline:
            break
    wall, used = clock() - t0, cpu() - c0
    queued = min(max(0.0, run_delay() - q0), max(0.0, wall - used))
    return n, wall, used, queued


# -- the source -------------------------------------------------------------------------------


@dataclass
class SourceSample:
    """What the doctor knows about SOURCE: its kind, size, and a random sample of it."""

    path: str
    kind: str  # "folder" | "records"
    count: int
    total_bytes: int
    files: list[str] = field(default_factory=list)  # folder: sampled paths
    positions: list[int] = field(default_factory=list)  # records: sampled positions
    payloads: list[bytes] = field(default_factory=list)  # image bytes of the sample
    records: Any = None  # the open_records object for a records source

    def close(self) -> None:
        if self.records is not None:
            with contextlib.suppress(Exception):
                self.records.close()
            self.records = None


def _scan_folder(root: str) -> list[str]:
    """Image files below ``root`` (names only: no per-file stat, so a million files stay quick)."""
    paths: list[str] = []
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.name.startswith("."):
                continue
            if e.is_dir(follow_symlinks=True):
                stack.append(e.path)
            elif os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS:
                paths.append(e.path)
    return paths


def sample_source(path: str, *, n: int, seed: int = 0) -> SourceSample:
    """Open SOURCE (an image folder, a ``.rec``/``.idx`` or a ``.stoker.json``) and pick ``n``
    random samples. Payloads are not read yet (the read stages do that)."""
    from stoker._core.errors import StokerFormatError

    rng = np.random.default_rng(seed)
    path = os.fspath(path)
    if os.path.isdir(path):
        files = _scan_folder(path)
        if not files:
            raise StokerFormatError(
                f"{path}: no image files found (looked for {', '.join(sorted(IMAGE_EXTENSIONS))})"
            )
        pick = [files[i] for i in rng.choice(len(files), size=min(n, len(files)), replace=False)]
        sizes = []
        for p in pick:
            with contextlib.suppress(OSError):
                sizes.append(os.path.getsize(p))
        total = int(np.mean(sizes) * len(files)) if sizes else 0  # estimated from the sample
        return SourceSample(path, "folder", len(files), total, files=pick)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or folder")
    try:
        from stoker.formats.recordio import open_records
    except ImportError as e:  # pragma: no cover - the formats room is part of stoker
        raise StokerFormatError(
            f"{path}: reading RecordIO needs stoker.formats.recordio ({e})"
        ) from e
    records = open_records(path)
    count = len(records)
    if count == 0:
        records.close()
        raise StokerFormatError(f"{path}: holds no records")
    total = 0
    for r in getattr(records, "shards", None) or [records]:
        f = getattr(r, "path", None)
        with contextlib.suppress(OSError, TypeError):
            total += os.path.getsize(f)  # type: ignore[arg-type]
    chosen = sorted(int(i) for i in rng.choice(count, size=min(n, count), replace=False))
    return SourceSample(path, "records", count, total, positions=chosen, records=records)


# -- storage ----------------------------------------------------------------------------------


def evict(fd: int, offset: int = 0, length: int = 0) -> bool:
    """Ask the kernel to drop the cached pages of a file range (no root needed)."""
    # the pages stay if another process maps them; the report compares cold with warm
    try:
        os.fdatasync(fd)  # dirty pages cannot be dropped; write them out first
    except OSError:
        pass
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        return True
    except (AttributeError, OSError):
        return False


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def measure_read_files(
    sample: SourceSample, *, seconds: float, cold: bool
) -> tuple[Stage, list[bytes]]:
    """Read the sampled files one by one (as a loader over a folder does)."""
    files = sample.files
    if cold:
        for p in files:
            with contextlib.suppress(OSError):
                fd = os.open(p, os.O_RDONLY)
                try:
                    evict(fd)
                finally:
                    os.close(fd)
    out: list[bytes] = []
    nbytes = 0

    def read(p: str) -> None:
        nonlocal nbytes
        b = _read_file(p)
        nbytes += len(b)
        if len(out) < len(files):
            out.append(b)

    n, wall, cpu, queued = time_loop(
        read, files, seconds=seconds if not cold else 1e9, cycle=not cold
    )
    label = "cold: pages evicted before reading" if cold else "warm: page cache"
    name = f"read files ({'cold' if cold else 'warm'})"
    return Stage(name, "storage", n, wall, cpu, nbytes, label, queued), out


def measure_read_packed(
    payloads: list[bytes], *, seconds: float, directory: str | None
) -> tuple[Stage, Stage]:
    """Write the sampled payloads back to back into one temporary file next to the data and
    read them with ``pread`` (what a packed ``.rec`` costs): cold, then warm."""
    fd_tmp, tmp = _tempfile(directory)
    try:
        offsets = []
        pos = 0
        with os.fdopen(fd_tmp, "wb") as f:
            for b in payloads:
                offsets.append((pos, len(b)))
                f.write(b)
                pos += len(b)
            f.flush()
            os.fsync(f.fileno())
        fd = os.open(tmp, os.O_RDONLY)
        try:
            evict(fd)
            nbytes = 0

            def read(item: tuple[int, int]) -> None:
                nonlocal nbytes
                nbytes += len(os.pread(fd, item[1], item[0]))

            n, wall, cpu, queued = time_loop(read, offsets, seconds=1e9, cycle=False)
            where = os.path.dirname(tmp)
            cold = Stage(
                "read packed (cold)",
                "storage",
                n,
                wall,
                cpu,
                nbytes,
                f"one file of the sampled payloads in {where}, pages evicted",
                queued,
            )
            nbytes = 0
            n, wall, cpu, queued = time_loop(read, offsets, seconds=seconds)
            warm = Stage(
                "read packed (warm)", "storage", n, wall, cpu, nbytes, "page cache", queued
            )
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return cold, warm


def _tempfile(directory: str | None) -> tuple[int, str]:
    for d in (directory, None):
        try:
            return tempfile.mkstemp(prefix=".stoker-doctor-", suffix=".tmp", dir=d)
        except OSError:
            continue
    raise OSError("cannot create a temporary file for the packed-read measurement")


def _evict_records(r: Any, positions: list[int]) -> None:
    """Evict the pages of the sampled records (of a single ``.rec``; shards: each shard's)."""
    shards = getattr(r, "shards", None)
    if shards:  # a RecordSet: position -> (shard, position in it)
        starts = np.cumsum([0] + [len(s) for s in shards])
        for i in positions:
            j = int(np.searchsorted(starts, i, side="right") - 1)
            _evict_records(shards[j], [i - int(starts[j])])
        return
    path, offset_of = getattr(r, "path", None), getattr(r, "offset", None)
    if not isinstance(path, str) or not callable(offset_of):
        return
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            for i in positions:
                evict(fd, int(offset_of(i)), 1 << 20)
        finally:
            os.close(fd)


def measure_read_records(
    sample: SourceSample, *, seconds: float, cold: bool
) -> tuple[Stage, list[bytes]]:
    """Read the sampled records through ``open_records`` (as the loader does)."""
    r = sample.records
    positions = sample.positions
    if cold:
        _evict_records(r, positions)
    out: list[bytes] = []
    nbytes = 0

    def read(i: int) -> None:
        nonlocal nbytes
        _, img = r.read_header(i)
        b = bytes(img)  # touch every byte, as a decoder will
        nbytes += len(b)
        if len(out) < len(positions):
            out.append(b)

    n, wall, cpu, queued = time_loop(
        read, positions, seconds=seconds if not cold else 1e9, cycle=not cold
    )
    label = "cold: record pages evicted before reading" if cold else "warm: page cache"
    name = f"read records ({'cold' if cold else 'warm'})"
    return Stage(name, "storage", n, wall, cpu, nbytes, label, queued), out


# -- decode -----------------------------------------------------------------------------------


def _is_jpeg(b: bytes) -> bool:
    return b[:3] == b"\xff\xd8\xff"


def _dec_simplejpeg(b: bytes, min_size: tuple[int, int] | None) -> np.ndarray:
    import simplejpeg

    if min_size is None:
        return simplejpeg.decode_jpeg(b, colorspace="RGB")
    return simplejpeg.decode_jpeg(
        b, colorspace="RGB", min_height=min_size[0], min_width=min_size[1]
    )


def _dec_opencv(b: bytes, min_size: tuple[int, int] | None) -> np.ndarray:
    import cv2

    flag = cv2.IMREAD_COLOR
    if min_size is not None:
        h, w = _header_size(b)
        for factor, f in (
            (8, cv2.IMREAD_REDUCED_COLOR_8),
            (4, cv2.IMREAD_REDUCED_COLOR_4),
            (2, cv2.IMREAD_REDUCED_COLOR_2),
        ):
            if h // factor >= min_size[0] and w // factor >= min_size[1]:
                flag = f
                break
    img = cv2.imdecode(np.frombuffer(b, np.uint8), flag)
    if img is None:
        raise ValueError("OpenCV could not decode the payload")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def _dec_pillow(b: bytes, min_size: tuple[int, int] | None) -> np.ndarray:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(b)) as im:
        if min_size is not None:
            im.draft("RGB", (min_size[1], min_size[0]))
        return np.asarray(im.convert("RGB"))


def _header_size(b: bytes) -> tuple[int, int]:
    if _is_jpeg(b):
        import simplejpeg

        h, w, _, _ = simplejpeg.decode_jpeg_header(b)
        return int(h), int(w)
    import io

    from PIL import Image

    with Image.open(io.BytesIO(b)) as im:
        return im.height, im.width


def fallback_decode(b: bytes, min_size: tuple[int, int] | None = None) -> np.ndarray:
    """simplejpeg for JPEG, OpenCV for the rest (what ``stoker.codecs.decode`` does)."""
    if _is_jpeg(b):
        return _dec_simplejpeg(b, min_size)
    return _dec_opencv(b, min_size)


def decoders() -> dict[str, Callable[[bytes, tuple[int, int] | None], np.ndarray]]:
    """The decoders importable here, by name."""
    out: dict[str, Callable[[bytes, tuple[int, int] | None], np.ndarray]] = {}
    for name, mod, fn in (
        ("simplejpeg", "simplejpeg", _dec_simplejpeg),
        ("OpenCV", "cv2", _dec_opencv),
        ("Pillow", "PIL", _dec_pillow),
    ):
        try:
            __import__(mod)
        except ImportError:
            continue
        out[name] = fn
    return out


def measure_decode(
    name: str,
    fn: Callable[[bytes, tuple[int, int] | None], np.ndarray],
    payloads: list[bytes],
    *,
    seconds: float,
    min_size: tuple[int, int] | None = None,
) -> Stage | None:
    """Decode the payloads with ``fn``; ``None`` when the decoder takes none of them."""
    usable = payloads
    if name == "simplejpeg":
        usable = [b for b in payloads if _is_jpeg(b)]
    if not usable:
        return None
    nbytes = 0

    def dec(b: bytes) -> None:
        nonlocal nbytes
        fn(b, min_size)
        nbytes += len(b)

    n, wall, cpu, queued = time_loop(dec, usable, seconds=seconds, min_items=min(len(usable), 8))
    note = f"{len(usable)} of {len(payloads)} payloads" if len(usable) < len(payloads) else ""
    label = f"decode {name}" + (f" at >= {min_size[0]}x{min_size[1]}" if min_size else "")
    return Stage(label, "decode", n, wall, cpu, nbytes, note, queued)


# -- transforms -------------------------------------------------------------------------------


def transform_ops(t: object) -> list[object]:
    """The steps of a ``Compose`` (timed one by one), else ``[t]``. A ``RandomChoice`` also
    holds a ``transforms`` list but applies one of them: it counts as one op."""
    try:
        from stoker.transforms.compose import Compose
    except ImportError:  # pragma: no cover - the transforms room is part of stoker
        return [t]
    if type(t) is Compose and len(t.transforms) > 0:
        return list(t.transforms)
    return [t]


def measure_transforms(
    t: Any, images: list[np.ndarray], *, seconds: float, seed: int = 0
) -> tuple[Stage, list[tuple[str, float, float]], list[np.ndarray]]:
    """Apply ``t`` to decoded images with the per-sample generator the loader hands it.

    Returns the stage, a per-op breakdown ``(op, wall s/sample, cpu s/sample)`` (ops of a
    Compose timed one by one on the same inputs) and the outputs of one pass.
    """
    from stoker._core.seeding import sample_rng

    rngs = [sample_rng(seed, 0, i) for i in range(len(images))]
    idx = list(range(len(images)))
    outputs: list[np.ndarray] = []

    def run(i: int) -> None:
        y = t(images[i], rngs[i])
        if len(outputs) < len(images):
            outputs.append(np.asarray(y))

    n, wall, cpu, queued = time_loop(run, idx, seconds=seconds, min_items=min(len(idx), 8))
    stage = Stage("augment (transforms)", "augment", n, wall, cpu, 0, type(t).__name__, queued)
    ops = transform_ops(t)
    breakdown: list[tuple[str, float, float]] = []
    if len(ops) > 1:
        clock, thread_cpu = time.perf_counter, time.thread_time
        per = [[0.0, 0.0] for _ in ops]
        count = 0
        deadline = clock() + seconds
        while count < min(len(images), 64) or clock() < deadline:
            i = count % len(images)
            x = images[i]
            rng = sample_rng(seed, 0, i)
            for j, op in enumerate(ops):
                t0, c0 = clock(), thread_cpu()
                x = op(x, rng)  # type: ignore[operator]
                per[j][0] += clock() - t0
                per[j][1] += thread_cpu() - c0
            count += 1
            if count >= 4 * len(images):
                break
        breakdown = [(type(op).__name__, w / count, c / count) for op, (w, c) in zip(ops, per)]
    return stage, breakdown, outputs


def measure_assemble(outputs: list[np.ndarray], *, batch_size: int, seconds: float) -> Stage | None:
    """What a worker adds per sample around the transforms: re-keying its per-sample generator
    (``SampleRngs.at``) and the write of the result into its batch slot."""
    from stoker._core.seeding import SampleRngs

    shapes = {o.shape for o in outputs}
    if not outputs or len(shapes) != 1:
        return None
    slot = np.empty((batch_size, *outputs[0].shape), dtype=outputs[0].dtype)
    slot.fill(0)  # fault the pages in now: the loader's ring is reused, not fresh memory
    idx = list(range(len(outputs)))

    at = SampleRngs(0, 0).at

    def put(i: int) -> None:
        at(i)
        np.copyto(slot[i % batch_size], outputs[i], casting="no")

    n, wall, cpu, queued = time_loop(put, idx, seconds=seconds, min_items=min(len(idx), 8))
    nbytes = n * outputs[0].nbytes
    return Stage("assemble (rng + batch slot write)", "loader", n, wall, cpu, nbytes, "", queued)


# -- the loader -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoaderRun:
    workers: int
    samples: int
    seconds: float
    startup_s: float
    worker_threads: tuple[int, ...] = ()
    start_method: str | None = None
    main_cpu_s: float = 0.0  # CPU time of this (the consuming) process over the window

    @property
    def main_cpu_per_sample_s(self) -> float:
        return self.main_cpu_s / self.samples if self.samples else 0.0

    @property
    def rate(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def measure_loader(
    source: Any,
    *,
    workers: int,
    batch_size: int,
    transforms: Any,
    seconds: float,
    warmup_batches: int | None = None,
) -> LoaderRun:
    """Run ``stoker.Loader`` with ``workers`` workers; samples/s after the ring drained.

    The first ``2 * workers + 2`` batches are not counted: they include process start-up and
    the batches prefetched while it ran.
    """
    import psutil

    from stoker.loader import Loader

    warm = warmup_batches if warmup_batches is not None else 2 * workers + 2
    t_start = time.perf_counter()
    threads: tuple[int, ...] = ()
    method: str | None = None
    with Loader(
        source, batch_size=batch_size, transforms=transforms, workers=workers, shuffle=True, seed=0
    ) as loader:
        method = getattr(loader, "start_method", None)
        if callable(method):
            method = method()
        got = 0
        samples = 0
        t0 = t_first = None
        p0 = 0.0
        clock = time.perf_counter
        deadline = None
        done = False
        while not done:
            progressed = False
            for batch in loader:
                progressed = True
                got += 1
                if t_first is None:
                    t_first = clock()
                if got == warm:
                    threads = _worker_threads(loader, psutil)
                    if not isinstance(method, str):
                        method = _start_method_seen(psutil)
                    p0 = time.process_time()
                    t0 = clock()
                    deadline = t0 + seconds
                    continue
                if t0 is not None:
                    samples += len(batch.images) if hasattr(batch, "images") else batch_size
                    if clock() >= deadline and samples >= batch_size * 3:  # type: ignore[operator]
                        done = True
                        break
            if not progressed:
                break
        t_end = clock()
        main_cpu = time.process_time() - p0 if t0 is not None else 0.0
    if t0 is None:
        raise RuntimeError(f"the loader gave only {got} batches; need more than {warm} to measure")
    startup = (t_first or t_end) - t_start
    return LoaderRun(
        workers,
        samples,
        t_end - t0,
        startup,
        threads,
        method if isinstance(method, str) else None,
        main_cpu,
    )


def _start_method_seen(psutil: Any) -> str | None:
    """How this process's workers were started, from the command lines of its children."""
    try:
        kids = psutil.Process().children(recursive=False)
    except psutil.Error:
        return None
    seen = None
    for k in kids:
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(k.cmdline())
            if "forkserver" in cmd and k.children():
                return "forkserver"
            if "multiprocessing.spawn" in cmd or "spawn_main" in cmd:
                seen = "spawn"
    return seen


def _worker_threads(loader: Any, psutil: Any) -> tuple[int, ...]:
    pids: list[int] = []
    fn = getattr(loader, "worker_pids", None)
    if callable(fn):
        with contextlib.suppress(Exception):
            pids = [int(p) for p in fn()]
    procs = []
    if pids:
        for p in pids:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(p))
    else:
        me = os.getpid()
        with contextlib.suppress(psutil.Error):
            for k in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    cmd = " ".join(k.cmdline())
                    if "resource_tracker" in cmd or ("forkserver" in cmd and k.ppid() == me):
                        continue  # multiprocessing's own processes, not workers
                    procs.append(k)
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out.append(int(p.num_threads()))
    return tuple(out)
