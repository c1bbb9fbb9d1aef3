"""GPU check of stoker's CUDA edge: correctness under widened race windows, flat device memory,
and the data-wait per training step with and without ``CudaPrefetcher``.

Needs only this repository and torch (with CUDA for the real check)::

    python scripts/gpu_check.py                   # full run
    python scripts/gpu_check.py --quick           # smaller
    python scripts/gpu_check.py --device cpu --quick   # the same code paths on the CPU

Checks (exit status 1 if any fails):

a. bit-exact: 1,000 batches from a hostile loader double (a ring of slots that is scribbled
   over the moment a slot is released) go through the prefetcher while ``torch.cuda._sleep``
   delays the side stream (every copy) and the consumer stream (every other step), so any early
   slot release, early staging-buffer reuse, missing consumer wait or missing ``record_stream``
   shows up as wrong data. Pass 1: pageable slots (pinned staging), float16 normalised with
   GPU flip and erase, compared element by element with a synchronous reference computed on
   the device. Pass 2: pinned slots (copied directly, so the slot itself must be held until the
   copy event completes), float32 unnormalised, device checksums compared with host checksums.
   A control pass runs a deliberately broken variant (events treated as complete at once, no
   consumer wait); the check fails if the harness does not catch it. On the CPU the passes
   run through the fake backend of ``tests/torch/torch_doubles.py`` (deferred copies, late events).
b. memory: ``torch.cuda.memory_allocated`` after each of several epochs through one
   prefetcher stays flat (within half a batch); one side stream; the page-locked staging
   buffers still alive after batches of 25 shapes stay within ``pool_shapes * (depth + 2)``.
d. fields: batches that carry fields (boxes and classes padded with their lengths, a score
   vector, the stored size, a caption) from a ring whose every column is scribbled over when
   its slot is freed go through the prefetcher under the same delays as (a); every column and
   length must arrive on the device bit-exact and the caption on the host; a control with the
   broken protocol must be caught.
c. timing: a small ResNet-style model trained on sample data packed on the spot and read by
   ``stoker.Loader``: steps/s, data-wait ms/step and its share of the step, for the plain
   ``.to(device)`` loop and for ``CudaPrefetcher``.

The loader double (``SlotRing``) and the delayed and broken CUDA backends come from
``tests/torch/torch_doubles.py``; they reach the prefetcher through its public ``backend=`` seam.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
try:
    import stoker  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests" / "torch"))  # the stream-protocol doubles

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch_doubles import IMAGENET_MEAN as MEAN  # noqa: E402
from torch_doubles import IMAGENET_STD as STD  # noqa: E402
from torch_doubles import (  # noqa: E402
    BrokenBackend,
    BrokenFakeBackend,
    FakeBackend,
    FieldRing,
    SlotRing,
    SlowCopyBackend,
    delay,
    field_batch,
    random_images,
)

import stoker  # noqa: E402
from stoker.torch import CudaPrefetcher, convert_images  # noqa: E402
from stoker.torch.augment import batch_generator  # noqa: E402


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- (a) bit-exact


def batch_content(i: int, shape: tuple[int, ...]) -> np.ndarray:
    """The true content of batch ``i`` (regenerated for the reference, never kept)."""
    return random_images(shape, seed=1_000_003 + i)


def hostile_ring(
    n: int, shape: tuple[int, ...], *, slots: int, pinned: bool, pin: Any = None
) -> SlotRing:
    """A loader double whose slots are scribbled over the moment they are free again;
    ``pinned`` slots are copied directly, so the prefetcher must hold each until its copy
    event has completed (``pin``: a fake backend's flag for them, on the CPU)."""
    return SlotRing(
        n, shape, lambda i: batch_content(i, shape), slots=slots, pinned=pinned, pin=pin
    )


def _host_checksums(a: np.ndarray) -> tuple[int, int]:
    """Sum and position-weighted sum of the NCHW-ordered batch (weights 1..K mod 65521)."""
    x = np.ascontiguousarray(a.transpose(0, 3, 1, 2)).reshape(-1).astype(np.int64)
    w = (np.arange(x.size, dtype=np.int64) % 65521) + 1
    return int(x.sum()), int((x * w).sum())


def _device_checksums(t: torch.Tensor) -> torch.Tensor:
    x = t.contiguous().reshape(-1).to(torch.int64)
    w = (torch.arange(x.numel(), device=t.device, dtype=torch.int64) % 65521) + 1
    return torch.stack([x.sum(), (x * w).sum()])


def _channel_stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``MEAN`` and ``STD`` shaped (1, 3, 1, 1) on ``device``, as ``convert_images`` takes them."""
    return (
        torch.tensor(MEAN, device=device).view(1, 3, 1, 1),
        torch.tensor(STD, device=device).view(1, 3, 1, 1),
    )


def _device_reference(
    content: np.ndarray,
    device: torch.device,
    stats: tuple[torch.Tensor, torch.Tensor],
    *,
    epoch: int,
    number: int,
) -> torch.Tensor:
    """The normalised pass's expected output for one batch, computed synchronously on the
    device: float16, normalised, with the flip and erase of (seed 11, epoch, number)."""
    gen = batch_generator(11, epoch, number, device)
    host = torch.from_numpy(content)
    if device.type == "cuda":  # pinned + non_blocking: the host keeps running ahead
        host = host.pin_memory().to(device, non_blocking=True)
    return convert_images(
        host,
        mean=stats[0],
        std=stats[1],
        dtype=torch.float16,
        flip_p=0.5,
        erase_p=0.25,
        generator=gen,
    )


def run_bit_exact_pass(
    device: torch.device,
    *,
    batches: int,
    shape: tuple[int, ...],
    pinned: bool,
    normalise: bool,
    backend: Any = None,
    consumer_cycles: int = 0,
    depth: int = 1,
) -> int:
    """One pass through a hostile ring; returns the number of wrong batches."""
    cuda = device.type == "cuda"
    fake = isinstance(backend, FakeBackend)
    pin = backend.pin if fake and pinned else None
    ring = hostile_ring(batches, shape, slots=depth + 3, pinned=pinned and cuda, pin=pin)
    kw: dict[str, Any] = {"depth": depth, "seed": 11}
    if normalise:
        kw.update(mean=MEAN, std=STD, dtype=torch.float16, flip_p=0.5, erase_p=0.25)
    if backend is not None:
        kw["backend"] = backend
    else:
        kw["device"] = device
    pf = CudaPrefetcher(ring, **kw)
    stats = _channel_stats(device)
    bad_images = torch.zeros(batches, dtype=torch.bool, device=device)
    bad_labels = torch.zeros(batches, dtype=torch.bool, device=device)
    sums = torch.zeros(batches, 2, dtype=torch.int64, device=device)
    host_sums = np.zeros((batches, 2), dtype=np.int64)
    n = 0
    for out in pf:
        i = out.number
        if cuda and consumer_cycles and i % 2 == 0:
            delay(consumer_cycles)  # a slow step: the host runs ahead of the consumer stream
        content = batch_content(i, shape)
        if normalise:
            ref = _device_reference(content, device, stats, epoch=out.epoch, number=i)
            bad_images[i] = (out.images != ref).any()
        else:
            sums[i] = _device_checksums(out.images.to(torch.int64))
            host_sums[i] = _host_checksums(content)
        bad_labels[i] = (out.labels != i).any()
        n += 1
    if cuda:
        torch.cuda.synchronize(device)
    wrong = bad_images | bad_labels
    if not normalise:
        wrong |= (sums.cpu() != torch.from_numpy(host_sums)).any(dim=1).to(device)
    n_wrong = int(wrong.sum())
    if n != batches:
        n_wrong += abs(batches - n)
    if sorted(ring.free) != list(range(len(ring.images))):
        log(f"    slots not all returned: free={sorted(ring.free)}")
        n_wrong += 1
    return n_wrong


def check_bit_exact(
    device: torch.device, *, batches: int = 1000, sleep_cycles: int = 2_000_000
) -> int:
    """Check (a). Returns the number of problems (0 = pass)."""
    cuda = device.type == "cuda"
    shape = (32, 32, 32, 3)
    problems = 0
    passes = [
        ("pageable slots, pinned staging, fp16 + flip/erase vs device reference", False, True),
        ("pinned slots, direct copy, fp32 vs host checksums", True, False),
    ]
    for depth in (1, 2):
        for name, pinned, normalise in passes:
            # on the CPU: copies deferred and events completed late by the fake backend
            backend = (
                SlowCopyBackend(device, sleep_cycles)
                if cuda
                else FakeBackend(lag=3, hold_events=True)
            )
            t0 = time.perf_counter()
            wrong = run_bit_exact_pass(
                device,
                batches=batches,
                shape=shape,
                pinned=pinned,
                normalise=normalise,
                backend=backend,
                consumer_cycles=sleep_cycles if cuda else 0,
                depth=depth,
            )
            dt = time.perf_counter() - t0
            status = "ok" if wrong == 0 else f"FAIL: {wrong} wrong batches"
            log(f"  (a) depth {depth}, {name}: {batches} batches in {dt:.1f} s: {status}")
            problems += wrong
    caught = 0
    for pinned, normalise in ((True, False), (False, True)):
        try:
            caught += run_bit_exact_pass(
                device,
                batches=min(batches, 300),
                shape=shape,
                pinned=pinned,
                normalise=normalise,
                backend=BrokenBackend(device, sleep_cycles * 5) if cuda else BrokenFakeBackend(),
                consumer_cycles=sleep_cycles * 5 if cuda else 0,
            )
        except Exception as e:  # a broken protocol may also crash: caught as well
            log(f"  (a) control pass raised {type(e).__name__}: {e}")
            caught += 1
    if caught:
        log(f"  (a) control: a broken protocol gives {caught} wrong batches: caught")
    else:  # a harness that cannot see a broken protocol proves nothing about a sound one
        problems += 1
        log(
            "  (a) control: FAIL: a broken protocol gives 0 wrong batches: NOT caught "
            "(the harness is too gentle here; raise --sleep-cycles)"
        )
    return problems


# --------------------------------------------------------------------------- (d) fields


def _wrong_fields(out: Any, ref: Any, device: torch.device) -> bool:
    """True when a prefetched batch's fields differ from the batch ``ref`` the ring held."""
    wrong = out["caption"] != ref["caption"] or out.fields["caption"].device.type != "cpu"
    for name, col in ref.fields.items():
        if name == "caption":
            continue
        got = out.fields[name]
        wrong |= got.device.type != device.type
        wrong |= bool((got != torch.from_numpy(col).to(device)).any())
        if name in ref.lengths:
            n = out.lengths[name]
            wrong |= bool((n != torch.from_numpy(ref.lengths[name]).to(device)).any())
    return bool(wrong)


def run_fields_pass(
    device: torch.device, *, batches: int, backend: Any, consumer_cycles: int, depth: int
) -> int:
    """One pass of batches with fields through a hostile ring; returns the wrong batches."""
    cuda = device.type == "cuda"
    refs = [field_batch(16, seed=i, hw=(24, 24)) for i in range(batches)]
    ring = FieldRing(refs, slots=depth + 2)
    wrong = n = 0
    for out in CudaPrefetcher(ring, backend=backend, depth=depth, mean=MEAN, std=STD):
        if cuda and consumer_cycles and out.number % 2 == 0:
            delay(consumer_cycles)  # a slow step: the host runs ahead of the consumer stream
        wrong += _wrong_fields(out, refs[out.number], device)
        n += 1
    return wrong + abs(batches - n) + (ring.freed != batches)


def check_fields(device: torch.device, *, batches: int, sleep_cycles: int) -> int:
    """Check (d). Returns the number of problems (0 = pass)."""
    cuda = device.type == "cuda"
    problems = 0
    for depth in (1, 2):
        backend = (
            SlowCopyBackend(device, sleep_cycles) if cuda else FakeBackend(lag=3, hold_events=True)
        )
        wrong = run_fields_pass(
            device,
            batches=batches,
            backend=backend,
            consumer_cycles=sleep_cycles if cuda else 0,
            depth=depth,
        )
        status = "ok" if not wrong else f"FAIL: {wrong} wrong batches"
        log(f"  (d) depth {depth}, {batches} batches with fields: {status}")
        problems += wrong
    try:
        caught = run_fields_pass(
            device,
            batches=min(batches, 100),
            backend=BrokenBackend(device, sleep_cycles * 5) if cuda else BrokenFakeBackend(),
            consumer_cycles=sleep_cycles * 5 if cuda else 0,
            depth=1,
        )
    except Exception as e:  # a broken protocol may also crash: caught as well
        log(f"  (d) control pass raised {type(e).__name__}: {e}")
        caught = 1
    if caught:
        log(f"  (d) control: a broken protocol gives {caught} wrong batches: caught")
    else:
        problems += 1
        log("  (d) control: FAIL: a broken protocol gives 0 wrong batches: NOT caught")
    return problems


# --------------------------------------------------------------------------- (b) memory


def check_memory_flat(device: torch.device, *, epochs: int = 6, batches: int = 50) -> int:
    """Check (b). Returns the number of problems (0 = pass)."""
    cuda = device.type == "cuda"
    shape = (64, 48, 48, 3)
    ring = hostile_ring(batches, shape, slots=4, pinned=False)
    backend = SlowCopyBackend(device) if cuda else None  # no delay; counts streams and buffers
    pf = CudaPrefetcher(
        ring, device=device, backend=backend, mean=MEAN, std=STD, dtype=torch.bfloat16, depth=2
    )
    marks: list[int] = []
    for _ in range(epochs):
        for out in pf:
            out.images.float().mean()  # the consumer uses the batch
        if cuda:
            torch.cuda.synchronize(device)
            marks.append(int(torch.cuda.memory_allocated(device)))
        else:
            marks.append(0)
    problems = 0
    if backend is not None and backend.streams_made != 1:
        problems += 1
        log(f"  (b) FAIL: {backend.streams_made} side streams made, not one for all epochs")
    pools = dict(backend.pinned) if backend is not None else {}
    steady = marks[1:]
    tolerance = 64 * 48 * 48 * 3  # half an output batch (bfloat16): a leaked batch shows
    growth = max(steady) - min(steady) if steady else 0
    if cuda and growth > tolerance:
        problems += 1
    mib = [round(m / 2**20, 2) for m in marks]
    verdict = "ok" if problems == 0 else "FAIL"
    where = "device MiB after each epoch" if cuda else "(CPU: no device memory to watch)"
    log(
        f"  (b) {epochs} epochs x {batches} batches, {where}: {mib if cuda else ''} "
        f"growth after epoch 1: {growth} B; pinned buffers per shape: {list(pools.values())}: {verdict}"
    )
    return problems + check_pools_bounded(device)


def check_pools_bounded(device: torch.device, *, depth: int = 2, epochs: int = 2) -> int:
    """Check (b), pinned pools: batches of 24 widths and a partial last batch, through one
    prefetcher for ``epochs`` epochs; the page-locked buffers still alive afterwards must be
    at most ``depth + 2`` per shape for at most ``pool_shapes`` shapes (a pool keyed by shape
    that is never trimmed keeps at least one buffer per shape: 25 here). On the CPU the fake backend of
    ``tests/torch/torch_doubles.py`` stands in for CUDA (the same pools, the same accounting)."""
    cuda = device.type == "cuda"
    backend: Any = SlowCopyBackend(device) if cuda else FakeBackend(lag=1)
    widths = [16 + 4 * k for k in range(24)]
    batches = [(random_images((8, 16, w, 3), seed=w), np.arange(8)) for w in widths]
    batches.append((random_images((3, 16, 16, 3), seed=1), np.arange(3)))  # partial last batch
    pf = CudaPrefetcher(batches, backend=backend, depth=depth)
    for _ in range(epochs):
        for images, _labels in pf:
            images.float().mean()
    gc.collect()
    live = backend.live_pinned()
    bound = pf.pool_shapes * (depth + 2)
    made = backend.pinned if isinstance(backend.pinned, int) else sum(backend.pinned.values())
    ok = live <= bound
    log(
        f"  (b) pinned pools over {len(batches)} shapes x {epochs} epochs: {live} buffers alive "
        f"({made} made), bound {bound}: {'ok' if ok else 'FAIL'}"
    )
    return 0 if ok else 1


# --------------------------------------------------------------------------- (c) timing


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.short is None else self.short(x)))


class SmallResNet(nn.Module):
    """ResNet-style: a stem and three stages of two basic blocks (32/64/128 channels)."""

    def __init__(self, classes: int, width: int = 32) -> None:
        super().__init__()
        w = width
        self.stem = nn.Sequential(
            nn.Conv2d(3, w, 3, 2, 1, bias=False), nn.BatchNorm2d(w), nn.ReLU()
        )
        self.stages = nn.Sequential(
            BasicBlock(w, w, 1), BasicBlock(w, w, 1),
            BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 2 * w, 1),
            BasicBlock(2 * w, 4 * w, 2), BasicBlock(4 * w, 4 * w, 1),
        )  # fmt: skip
        self.head = nn.Linear(4 * w, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def make_data(workdir: Path, *, classes: int, per_class: int, size: int) -> Path:
    from stoker.pack import make_sample_data, pack

    images = make_sample_data(workdir / "images", classes=classes, per_class=per_class, size=size)
    rec = workdir / "train.rec"
    if not rec.exists():
        pack(images, workdir / "train", progress=False)
    return rec


def _timed_steps(
    mode: str, loader: Any, model: nn.Module, device: torch.device, *, steps: int
) -> dict:
    """Train ``steps`` steps; data-wait is the host time spent getting the next batch ready."""
    cuda = device.type == "cuda"
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    mean, std = _channel_stats(device)
    fmt = torch.channels_last if cuda else torch.contiguous_format
    prefetching = mode.startswith("CudaPrefetcher")
    # one prefetcher for all epochs (its side stream and pinned pools are reused)
    pf = CudaPrefetcher(loader, device=device, mean=MEAN, std=STD, channels_last=cuda)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def plain():  # the usual loop: a blocking copy and the conversion on the critical path
        for images, labels in loader:
            x = torch.from_numpy(images).to(device)
            x = convert_images(x, mean=mean, std=std, channels_last=cuda)
            yield x, torch.from_numpy(labels).to(device)

    wait = 0.0
    done = 0
    sync()
    t_start = time.perf_counter()
    while done < steps:
        it = iter(pf) if prefetching else plain()
        while done < steps:
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            if not prefetching:
                sync()  # the copy and conversion are part of the wait in the plain loop
            wait += time.perf_counter() - t0
            x = x.contiguous(memory_format=fmt)
            loss = loss_fn(model(x), y.long())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sync()
            done += 1
        it.close()  # type: ignore[union-attr]
    total = time.perf_counter() - t_start
    return {
        "mode": mode,
        "steps": done,
        "steps_per_s": done / total,
        "wait_ms_per_step": 1000 * wait / done,
        "wait_share": wait / total,
    }


def check_timing(device: torch.device, workdir: Path, *, quick: bool) -> list[dict]:
    """Check (c): prints the table; returns its rows."""
    from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize

    cuda = device.type == "cuda"
    classes, per_class = (10, 40) if quick else (10, 200)
    size, crop = 128, 112
    batch = 64 if quick else 128
    steps = 6 if quick else 40
    if not cuda:  # the CPU run only walks the code paths
        classes, per_class, batch, steps = 4, 16, 16, 3
    workers = max(1, min(8, (os.cpu_count() or 2) - 1))
    t0 = time.perf_counter()
    rec: Path | None = None
    try:  # JPEG encoding and packing need simplejpeg and crc32c (see docs/gpu.md)
        rec = make_data(workdir, classes=classes, per_class=per_class, size=size)
        log(
            f"  (c) sample data: {classes * per_class} JPEGs {size}x{size} packed in "
            f"{time.perf_counter() - t0:.1f} s -> {rec}"
        )
    except ImportError as e:
        log(f"  (c) source rec skipped: {e} (docs/gpu.md: running on a bare GPU machine)")
    torch.manual_seed(0)
    model = SmallResNet(classes).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        torch.backends.cudnn.benchmark = True
    transforms = Compose([Resize(size), RandomCrop(crop), HorizontalFlip()])
    n_mem = min(classes * per_class, 640)  # small enough for a 64 MiB /dev/shm (containers)
    rng = np.random.default_rng(0)
    x_mem = rng.integers(0, 256, size=(n_mem, crop, crop, 3), dtype=np.uint8)
    y_mem = rng.integers(0, classes, size=n_mem).astype(np.int64)
    rows = []
    sources: list[tuple[str, Any, Any]] = [
        ("rec", rec, transforms),  # JPEG decode + augment in the workers
        ("arrays", (x_mem, y_mem), None),  # nothing to decode: the copy to the GPU matters more
    ]
    sources = [src for src in sources if src[1] is not None]
    for name, src, tf in sources:
        try:
            with stoker.Loader(
                src,
                batch_size=batch,
                transforms=tf,
                shuffle=True,
                seed=0,
                workers=workers,
                drop_last=True,
            ) as loader:
                _timed_steps("warm-up", loader, model, device, steps=2)
                for mode in ("plain .to(device)", "CudaPrefetcher"):
                    row = _timed_steps(mode, loader, model, device, steps=steps)
                    row["source"] = name
                    rows.append(row)
        except stoker.LoaderError as e:  # a timing row is not a correctness check
            log(f"  (c) source {name}: the loader failed, rows skipped: {type(e).__name__}: {e}")
    log(
        f"  (c) batch {batch}, {crop}x{crop}, {workers} loader workers, {steps} steps per row, "
        f"device {device}; source rec = JPEG decode + crop + flip, arrays = uint8 in memory"
    )
    _log_timing_table(rows)
    return rows


def _log_timing_table(rows: list[dict]) -> None:
    log(f"      {'source':<7} {'mode':<20} {'steps/s':>8} {'data-wait ms/step':>18} {'share':>6}")
    for r in rows:
        log(
            f"      {r['source']:<7} {r['mode']:<20} {r['steps_per_s']:>8.2f} "
            f"{r['wait_ms_per_step']:>18.2f} {100 * r['wait_share']:>5.1f}%"
        )


# --------------------------------------------------------------------------- main


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)"
    )
    ap.add_argument("--quick", action="store_true", help="fewer batches and steps")
    ap.add_argument(
        "--batches", type=int, default=None, help="batches for check (a) (default 1000, quick 200)"
    )
    ap.add_argument(
        "--sleep-cycles", type=int, default=2_000_000, help="GPU cycles of delay per copy"
    )
    ap.add_argument(
        "--workdir", default=None, help="where to make sample data (default: a temp dir)"
    )
    ap.add_argument("--json", default=None, help="write the results here as JSON")
    ap.add_argument("--skip-timing", action="store_true", help="run (a) and (b) only")
    return ap.parse_args(argv)


def _open_device(name: str | None) -> tuple[torch.device, str] | None:
    """The device to check and the GPU's name; ``None`` when CUDA is asked for but absent."""
    device = torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda":
        torch.set_num_threads(1)  # the CPU run walks the code paths; keep it light
        return device, "none (CPU path)"
    if not torch.cuda.is_available():
        log("CUDA requested but torch.cuda.is_available() is False")
        return None
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    return device, torch.cuda.get_device_name(device)


def _run_timing(device: torch.device, args: argparse.Namespace) -> list[dict]:
    if args.workdir:
        wd = Path(args.workdir)
        wd.mkdir(parents=True, exist_ok=True)
        return check_timing(device, wd, quick=args.quick)
    with tempfile.TemporaryDirectory(prefix="stoker-gpu-check-") as tmp:
        return check_timing(device, Path(tmp), quick=args.quick)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    opened = _open_device(args.device)
    if opened is None:
        return 2
    device, gpu = opened
    batches = args.batches or (200 if args.quick else 1000)
    if device.type == "cpu" and args.batches is None:
        batches = 50
    log(
        f"stoker {stoker.__version__}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"python {platform.python_version()}, GPU: {gpu}, CPUs: {os.cpu_count()}"
    )
    t_all = time.perf_counter()
    results: dict[str, Any] = {"device": str(device), "gpu": gpu, "torch": torch.__version__}

    log("(a) bit-exact under widened race windows")
    results["bit_exact_problems"] = check_bit_exact(
        device, batches=batches, sleep_cycles=args.sleep_cycles
    )
    log("(b) device memory across epochs")
    results["memory_problems"] = check_memory_flat(device, epochs=4 if args.quick else 6)
    log("(d) fields move with the batch")
    results["field_problems"] = check_fields(
        device, batches=batches, sleep_cycles=args.sleep_cycles
    )
    if not args.skip_timing:
        log("(c) data-wait per step")
        results["timing"] = _run_timing(device, args)
    results["seconds"] = time.perf_counter() - t_all
    failed = results["bit_exact_problems"] + results["memory_problems"]
    failed += results["field_problems"]
    log(f"total {results['seconds']:.1f} s: {'PASS' if failed == 0 else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
