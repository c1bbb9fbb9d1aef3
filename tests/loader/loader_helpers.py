"""Module-level (picklable) test transforms and tiny data makers for the loader tests.

Array images carry their own index in pixel ``[0, 0]`` (low byte) and ``[0, 1]`` (high byte),
so a transform can decide to misbehave on one chosen sample.
"""

from __future__ import annotations

import ctypes
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

import numpy as np
import psutil
from PIL import Image

from stoker import ArraySpec
from stoker.transforms import Transform


def running(pid: int) -> bool:
    """True while `pid` is a process that is not a zombie (it may exit while we look)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def make_arrays(n: int, h: int = 12, w: int = 10) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)
    for i in range(n):
        x[i, 0, 0, 0] = i % 256
        x[i, 0, 1, 0] = i // 256
    y = np.arange(n, dtype=np.int64) % 5
    return x, y


def index_of(img: np.ndarray) -> int:
    return int(img[0, 0, 0]) + 256 * int(img[0, 1, 0])


def make_folder(root: str, *, n: int, size: tuple[int, int] = (36, 40)) -> None:
    rng = np.random.default_rng(3)
    for i in range(n):
        cls = f"class_{i % 3}"
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        arr = rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)
        ext = "png" if i % 21 == 20 else "jpg"
        Image.fromarray(arr).save(os.path.join(root, cls, f"img_{i:04d}.{ext}"))


def jpeg_bytes(arr: np.ndarray, quality: int = 90) -> bytes:
    b = io.BytesIO()
    Image.fromarray(arr).save(b, "JPEG", quality=quality)
    return b.getvalue()


def invert(img: np.ndarray) -> np.ndarray:
    """A plain function (no output_spec): what ``as_transform`` wraps."""
    return 255 - img


@dataclass(frozen=True)
class RandCrop(Transform):
    """Random crop to (h, w) plus a random flip, randomness from rng only."""

    h: int
    w: int

    def __call__(self, img, rng):
        y = int(rng.integers(0, img.shape[0] - self.h + 1))
        x = int(rng.integers(0, img.shape[1] - self.w + 1))
        out = img[y : y + self.h, x : x + self.w]
        if rng.random() < 0.5:
            out = out[:, ::-1]
        return out

    def output_spec(self, in_spec):
        return ArraySpec((self.h, self.w, *in_spec.shape[2:]), in_spec.dtype)


@dataclass(frozen=True)
class ToFloat(Transform):
    def __call__(self, img, rng):
        return img.astype(np.float32) / 255.0

    def output_spec(self, in_spec):
        return ArraySpec(in_spec.shape, "float32")


@dataclass(frozen=True)
class Invert(Transform):
    def __call__(self, img, rng):
        return 255 - img

    def output_spec(self, in_spec):
        return in_spec


@dataclass(frozen=True)
class Identity(Transform):
    def __call__(self, img, rng):
        return img

    def output_spec(self, in_spec):
        return in_spec


@dataclass(frozen=True)
class NoShape(Transform):
    """Declares an open shape (like a Resize of the shorter side)."""

    def __call__(self, img, rng):
        return img

    def output_spec(self, in_spec):
        return ArraySpec((None, None, 3), "uint8")


@dataclass(frozen=True)
class Misbehave(Transform):
    """Does ``what`` on the array image whose index is ``at``; identity otherwise."""

    what: str
    at: int = 5
    seconds: float = 30.0

    def __call__(self, img, rng):
        if index_of(img) != self.at:
            return img
        if self.what == "raise":
            raise KeyError(f"bad sample {self.at}")
        if self.what == "custom":
            raise CustomError("no", 3)
        if self.what == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.what == "segfault":
            ctypes.string_at(0)
        if self.what == "sleep":
            time.sleep(self.seconds)
        if self.what == "shape":
            return img[:, :-1]
        if self.what == "dtype":
            return img.astype(np.float32)
        if self.what == "exit":
            os._exit(3)
        return img

    def output_spec(self, in_spec):
        return in_spec


class CustomError(Exception):
    """An exception type whose constructor needs two arguments."""

    def __init__(self, a, b):
        super().__init__(a, b)


@dataclass(frozen=True)
class Strided(Transform):
    """Returns negative-stride, non-contiguous and read-only views."""

    def __call__(self, img, rng):
        out = img[::-1, ::-1]
        out.flags.writeable = False
        return out

    def output_spec(self, in_spec):
        return in_spec


@dataclass(frozen=True)
class CvThreads(Transform):
    """Writes OpenCV's thread count into pixel [0, 0, 0]."""

    def __call__(self, img, rng):
        import cv2

        out = img.copy()
        out[0, 0, 0] = cv2.getNumThreads()
        return out

    def output_spec(self, in_spec):
        return in_spec


@dataclass(frozen=True)
class KillOnce(Transform):
    """SIGKILLs (or segfaults) its worker the first time it sees each index in ``at``; a marker
    file in ``marks`` remembers, so the re-sent sample goes through."""

    marks: str
    at: tuple = (5,)
    how: str = "sigkill"

    def __call__(self, img, rng):
        i = index_of(img)
        if i in self.at:
            mark = os.path.join(self.marks, str(i))
            if not os.path.exists(mark):
                open(mark, "w").close()
                if self.how == "segfault":
                    ctypes.string_at(0)
                os.kill(os.getpid(), signal.SIGKILL)
        return img

    def output_spec(self, in_spec):
        return in_spec


@dataclass(frozen=True)
class MarkWorker(Transform):
    """Writes which process made the sample into pixel (0, 0, 2): 1 + the worker id (0 in the
    main process); worker 0 takes ``slow_s`` per sample (as a worker preempted by other jobs),
    the others ``fast_s``."""

    slow_s: float = 0.0
    fast_s: float = 0.0

    def __call__(self, img, rng):
        import multiprocessing
        import time

        name = multiprocessing.current_process().name
        wid = int(name.rsplit("-", 1)[1]) if name.startswith("stoker-worker-") else -1
        time.sleep(self.slow_s if wid == 0 else self.fast_s)
        out = img.copy()
        out[0, 0, 2] = wid + 1
        return out

    def output_spec(self, in_spec):
        return in_spec


# the documented top-level fields of a loader's state_dict, in the order it writes them
STATE_FIELDS = (
    "version",
    "dataset",
    "sampler",
    "seed",
    "batch_size",
    "pair",
    "epoch",
    "batch",
    "world_size",
    "drop_last",
    "resumed",
    "bad",
)


def sigkill_driver(proc) -> None:
    """SIGKILL a driver subprocess (a loader's main process) and close its pipes; not
    ``communicate()``: orphaned workers may still hold them."""
    try:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    finally:
        proc.stdout.close()
        proc.stderr.close()


_HERE = os.path.dirname(os.path.abspath(__file__))
_SRC = os.path.join(os.path.dirname(os.path.dirname(_HERE)), "src")


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default, so Python installs its
    KeyboardInterrupt handler even when the test run itself was started with SIGINT ignored
    (a background job of a non-interactive shell is), as a user's terminal job never is."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def driver(code: str | None = None, *args: str) -> subprocess.Popen:
    """A Python subprocess (``-c code`` when ``code`` is given, then ``args``) that imports
    stoker and these helpers, with pipes for its output."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([_SRC, _HERE]))
    argv = [sys.executable, *(["-c", textwrap.dedent(code)] if code is not None else []), *args]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_default_sigint,
    )


def wait_gone(pids, seconds) -> list[int]:
    """The ``pids`` still running after up to ``seconds`` (empty once all are gone)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if running(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return alive
