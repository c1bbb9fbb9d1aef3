"""Helpers for the pack tests: tiny real images written with Pillow, and worker-side hooks
(module-level so that pool workers can import them)."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
from PIL import Image

from stoker.pack.images import check_image


def image_bytes(
    size: tuple[int, int] = (32, 32),
    *,
    fmt: str = "JPEG",
    mode: str = "RGB",
    seed: int = 0,
    noise: int = 20,
    **save,
) -> bytes:
    """A small smooth-plus-noise image (w, h = size) encoded with Pillow."""
    w, h = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) % 256], axis=2)
    arr = np.clip(base + rng.integers(-noise, noise + 1, (h, w, 3)), 0, 255).astype(np.uint8)
    im = Image.fromarray(arr, "RGB")
    if mode != "RGB":
        im = im.convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt, **save)
    return buf.getvalue()


def noise_jpeg(size: int = 64, seed: int = 0, quality: int = 95) -> bytes:
    """A hard-to-compress JPEG (about 10 KB at 64x64)."""
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def make_tree(root: str, spec: dict[str, int], *, size=(32, 32), seed: int = 0) -> list[str]:
    """``spec`` = {class folder: number of JPEGs}; returns the relative paths written."""
    out = []
    for cls, n in spec.items():
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        for i in range(n):
            rel = f"{cls}/img{i:03d}.jpg"
            with open(os.path.join(root, rel), "wb") as f:
                f.write(image_bytes(size, seed=seed * 1000 + hash(cls) % 997 + i))
            out.append(rel)
    return out


def write(path: str, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ---- running `stoker pack` in a child process (kill and signal tests) ----

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pack_driver.py")


def noise_tree(root, n: int, bad: tuple[int, ...] = (), *, size: int = 64) -> int:
    """n noise JPEGs (~10 KB each at 64x64) in 3 classes; positions in ``bad`` are zero bytes."""
    for i in range(n):
        path = os.path.join(root, f"c{i % 3}", f"{i:04d}.jpg")
        write(path, b"" if i in bad else noise_jpeg(size, seed=i))
    return n


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default, so Python installs its
    KeyboardInterrupt handler even when the test run itself was started with SIGINT ignored
    (a background job of a non-interactive shell is), as a user's terminal job never is."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_driver(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, DRIVER, *args, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **{"preexec_fn": _default_sigint, **kw},  # a caller's own preexec_fn replaces it
    )


def wait_for(pred, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    return False


def family(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def assert_gone(procs: list[psutil.Process], timeout: float = 10.0) -> None:
    gone, alive = psutil.wait_procs(procs, timeout=timeout)
    assert not alive, f"left running: {[p.pid for p in alive]}"


def kill_group_at(proc: subprocess.Popen, at: float, sig: int = signal.SIGKILL) -> str:
    """Send ``sig`` to ``proc``'s process group ``at`` seconds from now unless it ended
    first, wait until it and its children are gone; where the signal landed."""
    deadline = time.monotonic() + at
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.002)
    procs = family(proc)
    landed = "after the run" if proc.poll() is not None else "mid-run"
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    proc.communicate(timeout=60)
    assert_gone(procs)
    return landed


def semaphores() -> set[str]:
    """The POSIX semaphores multiprocessing has made on this machine (``/dev/shm/sem.mp-*``)."""
    return set(glob.glob("/dev/shm/sem.mp-*"))


def unlink_orphan_semaphores(before: set[str]) -> None:
    """Remove the semaphores made since ``before`` that no live process maps: those of a
    process group killed with SIGKILL, whose resource tracker died with it. A semaphore a
    running process maps (another test run or program on the machine) is kept. Mappings are
    matched by inode: the process that makes a semaphore maps it under a temporary name it
    then links to the ``sem.mp-*`` one."""
    new = semaphores() - before
    if not new:
        return
    mapped: set[int] = set()
    for pid in psutil.pids():
        try:
            with open(f"/proc/{pid}/maps") as f:
                mapped.update(int(line.split()[4]) for line in f if "/dev/shm/sem." in line)
        except (OSError, ValueError, IndexError):
            continue
    for left in new:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(left).st_ino not in mapped:
                os.unlink(left)


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


# ---- worker-side hooks (passed as pack(_check=...)) ----

CRASH_MARKER = b"\xff\xd8\xffCRASH"


def crash_on_marker(data: bytes, **kw):
    """Segfault the worker (a NULL read) on files starting with CRASH_MARKER."""
    if data.startswith(CRASH_MARKER):
        ctypes.string_at(0)
    return check_image(data, **kw)


#: slow_check's delay; a test may set PACK_DRIVER_DELAY_S in the driver's environment
DELAY_S = float(os.environ.get("PACK_DRIVER_DELAY_S", "0.004"))


def slow_check(data: bytes, **kw):
    """check_image, 4 ms slower: gives signal tests time to land mid-run."""
    if DELAY_S:
        time.sleep(DELAY_S)
    return check_image(data, **kw)


# ---- packing as shard jobs (test_pack_jobs.py, test_pack_ray.py) ----


def set_digests(prefix: str) -> dict[str, str]:
    """sha256 of every file a pack leaves under ``prefix`` (shards, lists, manifest), by
    name; the plan file, which a one-machine pack does not write, left out."""
    folder, base = os.path.split(prefix)
    return {
        n: sha(os.path.join(folder, n))
        for n in sorted(os.listdir(folder))
        if n.startswith(base) and not n.endswith(".plan.json")
    }


def manifest_meaning(path: str) -> str:
    """The sha256 of what the manifest at ``path`` means, as :func:`stoker.formats.manifest.
    load` reads it (any schema version: a version-1 manifest written by an older release and
    its version-2 form mean the same), in one canonical JSON spelling."""
    from stoker.formats.manifest import load

    m = load(path)
    canon = {**m, "shards": [e.to_json() for e in m["shards"]]}
    return hashlib.sha256(json.dumps(canon, sort_keys=True).encode()).hexdigest()


def data_and_meaning(prefix: str) -> dict[str, str]:
    """:func:`set_digests` with the manifest by its meaning (:func:`manifest_meaning`) in
    place of its bytes: what stays the same across the manifest schema's versions."""
    out = set_digests(prefix)
    name = os.path.basename(prefix) + ".stoker.json"
    if name in out:
        out[name] = "meaning " + manifest_meaning(prefix + ".stoker.json")
    return out


def slow_driver_writes(monkeypatch, seconds: float = 1.0) -> None:
    """Each batch of records a shard writer takes in this process (a convert's driver) waits
    ``seconds`` first; pool processes, started afresh, write at speed. A convert's first shard,
    written here, then takes long enough that the local engine starts a pool for the rest."""
    import stoker.pack.run.outputs as outputs

    write_many = outputs.ShardWriters.write_many

    def slow(self, *a, **k):
        time.sleep(seconds)
        return write_many(self, *a, **k)

    monkeypatch.setattr(outputs.ShardWriters, "write_many", slow)


# --------------------------------------------------------------------------- kill and rerun
#: ``stoker COMMAND ARGS --quiet`` in a child, each record's write slowed down by
#: ``STOKER_WRITE_DELAY_S`` seconds (in the process that writes: pack's and convert's driver)
SLOWED_WRITES = """
import os, sys, time
import stoker.pack.run.outputs as outputs
delay = float(os.environ.get("STOKER_WRITE_DELAY_S", "0"))
if delay:
    write = outputs.ShardWriters.write
    def slow(self, *a, **k):
        time.sleep(delay)
        return write(self, *a, **k)
    outputs.ShardWriters.write = slow
    write_many = outputs.ShardWriters.write_many
    def slow_many(self, s, keys, images, labels, fields):
        errors = []  # one record a call, each slowed: a kill can land between any two
        for j in range(len(keys)):
            time.sleep(delay)
            got = write_many(self, s, keys[j:j + 1], images[j:j + 1], labels[j:j + 1],
                             fields[j:j + 1])
            errors += [(j, why) for _, why in got]
        return errors
    outputs.ShardWriters.write_many = slow_many
from stoker.cli import main
sys.exit(main([*sys.argv[1:], "--quiet"]))
"""


def start_slowed(args: list[str], delay: float) -> subprocess.Popen:
    """``stoker ARGS`` (``["pack", SRC, OUT, ...]``) in its own process group, each record's
    write ``delay`` s slower."""
    return subprocess.Popen(
        [sys.executable, "-c", SLOWED_WRITES, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_default_sigint,
        env={**os.environ, "STOKER_WRITE_DELAY_S": str(delay)},
    )


def random_moments(seed: int, k: int, last: float) -> list[float]:
    """``k`` seeded moments (seconds) from 0.05 to ``last``."""
    import random

    rng = random.Random(seed)
    return [round(rng.uniform(0.05, last), 3) for _ in range(k)]


def folder_files(prefix: str) -> dict[str, str]:
    """sha256 of every file in ``prefix``'s folder, by name."""
    folder = os.path.dirname(prefix)
    return {n: sha(os.path.join(folder, n)) for n in sorted(os.listdir(folder))}


def kill_and_rerun(args: list[str], out: str, clean: str, sig: int, at: float, delay: float):
    """Run ``stoker ARGS`` (writing the set ``out``) slowed by ``delay`` s per record, send
    ``sig`` to its group ``at`` s in, then check: a manifest that is there names the clean
    set whole; a rerun finishes it; the folder then holds the clean set's bytes, file for
    file (``clean``: its prefix, alone in its folder). Where the signal landed."""
    import json

    from stoker.formats import registry

    sems = semaphores()
    landed = kill_group_at(start_slowed(args, delay), at, sig)
    if sig == signal.SIGKILL:  # the group's SIGKILL took the semaphores' tracker
        unlink_orphan_semaphores(sems)
    manifest = out + ".stoker.json"
    what = (args[0], sig, at)
    if os.path.exists(manifest):  # a manifest names the whole set, every shard whole
        with open(manifest) as f:
            got = json.load(f)
        with open(clean + ".stoker.json") as f:
            assert got == json.load(f), (*what, "a short set committed")
    if not os.path.exists(manifest) or glob.glob(out + ".pack-journal*"):  # not finished
        rerun = start_slowed(args, 0.0)
        _, err = rerun.communicate(timeout=120)
        assert rerun.returncode == 0, (*what, err.decode())
    else:
        landed = "after the commit"
    assert registry.format_of(manifest).load("verify")(manifest, progress=False).ok, what
    assert folder_files(out) == folder_files(clean), what
    return landed


def header_of(reader, i: int):
    """The IRHeader of sample ``i`` of RecordIO reader ``reader``, from its shard's file."""
    j, row = reader.where(i)
    sh = reader.shard(j)
    return sh._file().read_header(sh._at(row))[0]
