"""Photo-like sample images with a learnable class signal, for demos, tests and benchmarks.

Each image is a smooth two-colour gradient with low-frequency texture (the "background"), one
striped object, two thin distractor lines and mild sensor noise. The class decides the object's
shape, the angle of its stripes and its hue; position, scale, rotation, stripe frequency, colour
jitter and background are random. A small CNN separates the classes within an epoch or two,
while the pixels are neither flat colour nor pure noise, so JPEG sizes and decode costs look like
those of real photos (sizes in docs/pack.md).

Everything is a pure function of ``(seed, class, index)``: the same call makes the same files,
whatever the number of workers.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stoker._core.atomic import write_bytes_atomic
from stoker._core.checks import check_int, check_optional_int
from stoker._core.errors import OutputExistsError
from stoker._core.files import SAMPLE_MARKER
from stoker._core.seeding import stream_rng
from stoker._core.system import usable_cores

__all__ = ["make_sample_data", "sample_image"]

MARKER = SAMPLE_MARKER
_N_SHAPES = 5  # disc, square, triangle, ring, cross
_DOMAIN = 0x53414D50  # "SAMP"


@dataclass(frozen=True)
class _Job:
    """One chunk of files for a worker: class ``cls``, indices ``[start, stop)``."""

    root: str
    cls: int
    classes: int
    start: int
    stop: int
    height: int
    width: int
    seed: int
    fmt: str


def _class_params(cls: int, classes: int) -> tuple[int, float, float]:
    """(shape, stripe angle in radians, hue in [0, 1)) for class ``cls``."""
    shape = cls % _N_SHAPES
    # spread stripe angles and hues so that neighbouring classes differ in more than one cue
    angle = math.pi * (((cls // _N_SHAPES) * 0.618034) % 1.0)
    hue = cls / max(classes, 1)
    return shape, angle, hue


def _hue_rgb(h: float, s: float, v: float) -> np.ndarray:
    k = (np.array([5.0, 3.0, 1.0]) + h * 6.0) % 6.0
    return 255.0 * v * (1.0 - s * np.clip(np.minimum(k, 4.0 - k), 0.0, 1.0))


def _shape_mask(shape: int, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    import cv2

    mask = np.zeros((h, w), np.uint8)
    s = min(h, w)
    cx = w * rng.uniform(0.3, 0.7)
    cy = h * rng.uniform(0.3, 0.7)
    r = s * rng.uniform(0.2, 0.34)
    rot = rng.uniform(-0.35, 0.35)
    shift = 4  # sub-pixel precision for cv2 drawing
    f = 1 << shift

    def poly(angles: np.ndarray, radii: np.ndarray) -> np.ndarray:
        a = angles + rot
        pts = np.stack([cx + radii * np.cos(a), cy + radii * np.sin(a)], axis=1)
        return np.round(pts * f).astype(np.int32)

    if shape in (0, 3):  # disc (filled), ring
        thick = -1 if shape == 0 else max(2, round(r * 0.35))
        cv2.circle(
            mask, (round(cx * f), round(cy * f)), round(r * f), 255, thick, cv2.LINE_AA, shift
        )
    elif shape == 1:  # square
        a = np.arange(4) * (math.pi / 2) + math.pi / 4
        cv2.fillPoly(mask, [poly(a, np.full(4, r * 1.2))], 255, cv2.LINE_AA, shift)
    elif shape == 2:  # triangle
        a = np.arange(3) * (2 * math.pi / 3) - math.pi / 2
        cv2.fillPoly(mask, [poly(a, np.full(3, r * 1.3))], 255, cv2.LINE_AA, shift)
    else:  # cross: two bars
        half_len, half_wid = r * 1.15, r * 0.32
        corners = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], np.float64)
        for bar_rot in (0.0, math.pi / 2):
            c, sn = math.cos(rot + bar_rot), math.sin(rot + bar_rot)
            px = corners[:, 0] * half_len
            py = corners[:, 1] * half_wid
            pts = np.stack([cx + px * c - py * sn, cy + px * sn + py * c], axis=1)
            cv2.fillPoly(mask, [np.round(pts * f).astype(np.int32)], 255, cv2.LINE_AA, shift)
    return mask


_GRIDS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    g = _GRIDS.get((h, w))
    if g is None:
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        s = float(min(h, w))
        g = (x / s, y / s)
        _GRIDS[(h, w)] = g
    return g


_TILES: dict[tuple[int, int, int], np.ndarray] = {}


def _noise_tile(seed: int, h: int, w: int) -> np.ndarray:
    """Gaussian noise (sigma 3) made once per process; images take random windows of it."""
    th, tw = max(2 * h, 256), max(2 * w, 256)
    tile = _TILES.get((seed, th, tw))
    if tile is None:
        rng = stream_rng(seed, _DOMAIN, 0xFFFF_FFFF, th, tw)
        tile = rng.standard_normal((th, tw), dtype=np.float32) * 3.0
        _TILES.clear()
        _TILES[(seed, th, tw)] = tile
    return tile


def sample_image(seed: int, cls: int, index: int, *, classes: int = 10, size=112) -> np.ndarray:
    """One sample image, uint8 (H, W, 3) RGB; a pure function of its arguments."""
    import cv2

    h, w = _size(size)
    rng = stream_rng(seed, _DOMAIN, cls, index)
    x, y = _grid(h, w)
    # background: a gradient between two colours plus low-frequency texture, drawn on a coarse
    # grid and upsampled (cubic to 16x16, then linear: smooth and cheap)
    grey = rng.uniform(60, 200)
    c0 = (grey + 0.5 * (rng.uniform(20, 235, 3) - grey)).astype(np.float32)  # muted colours
    c1 = (grey + 0.5 * (rng.uniform(20, 235, 3) - grey)).astype(np.float32)
    a = rng.uniform(0, 2 * math.pi)
    gy, gx = np.mgrid[0:5, 0:5].astype(np.float32) / 4.0
    t = gx * math.cos(a) + gy * math.sin(a)
    t = (t - t.min()) / max(float(np.ptp(t)), 1e-6)
    low = c0 + (c1 - c0) * t[..., None] + rng.uniform(-30, 30, (5, 5, 3)).astype(np.float32)
    low = cv2.resize(low, (16, 16), interpolation=cv2.INTER_CUBIC)
    img = cv2.resize(low, (w, h), interpolation=cv2.INTER_LINEAR)
    # the object: class shape filled with class-oriented stripes in the class hue
    shape, angle, hue = _class_params(cls, classes)
    angle += rng.uniform(-0.15, 0.15)
    freq = rng.uniform(7.0, 12.0) * 2 * math.pi
    stripes = 0.62 + 0.38 * np.sin(
        freq * (x * math.cos(angle) + y * math.sin(angle)) + rng.uniform(0, 2 * math.pi)
    )
    color = _hue_rgb(
        (hue + rng.uniform(-0.04, 0.04)) % 1.0, rng.uniform(0.55, 0.95), rng.uniform(0.7, 1.0)
    )
    obj = stripes[..., None] * color.astype(np.float32)
    alpha = _shape_mask(shape, h, w, rng).astype(np.float32) * (1.0 / 255.0)
    img += (obj - img) * alpha[..., None]
    # distractor edges
    s = min(h, w)
    for _ in range(2):
        p0 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        p1 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        col = tuple(float(v) for v in rng.uniform(0, 255, 3))
        cv2.line(img, p0, p1, col, max(1, s // 64), cv2.LINE_AA)
    # mild noise
    tile = _noise_tile(seed, h, w)
    oy = int(rng.integers(0, tile.shape[0] - h + 1))
    ox = int(rng.integers(0, tile.shape[1] - w + 1))
    img += tile[oy : oy + h, ox : ox + w, None]
    return np.clip(img, 0, 255).astype(np.uint8)


def _size(size) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)):
        h = w = int(size)
    else:
        try:
            h, w = (int(v) for v in size)
        except (TypeError, ValueError):
            raise TypeError(f"size must be an int or (height, width), got {size!r}") from None
    if h < 8 or w < 8:
        raise ValueError(f"size must be at least 8x8, got {h}x{w}")
    return h, w


def _class_dir(cls: int, classes: int) -> str:
    return f"class_{cls:0{max(2, len(str(classes - 1)))}d}"


def _run_job(job: _Job) -> int:
    import simplejpeg

    nbytes = 0
    folder = os.path.join(job.root, _class_dir(job.cls, job.classes))
    for i in range(job.start, job.stop):
        img = sample_image(job.seed, job.cls, i, classes=job.classes, size=(job.height, job.width))
        if job.fmt == "jpg":
            data = simplejpeg.encode_jpeg(img, 90, colorspace="RGB", colorsubsampling="420")
        else:
            import cv2

            ok, buf = cv2.imencode(".png", img[:, :, ::-1])
            data = buf.tobytes()
        with open(os.path.join(folder, f"{i:05d}.{job.fmt}"), "wb") as f:
            f.write(data)
        nbytes += len(data)
    return nbytes


def make_sample_data(
    dir: str | os.PathLike[str],
    *,
    classes: int = 10,
    per_class: int = 100,
    size: int | tuple[int, int] = 112,
    seed: int = 0,
    fmt: str = "jpg",
    workers: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Make ``classes`` folders ``class_NN/`` of ``per_class`` images each under ``dir``.

    ``size`` is an int (square) or ``(height, width)``; ``fmt`` is ``"jpg"`` or ``"png"``;
    ``workers`` processes (default: all cores) share the work. A folder already made by an
    identical call is reused as is. A non-empty folder made otherwise is refused unless
    ``overwrite=True``. Returns the folder's path.
    """
    classes = check_int("classes", classes, minimum=1)
    per_class = check_int("per_class", per_class, minimum=0)
    n_workers = check_optional_int("workers", workers, minimum=1) or usable_cores()
    if fmt not in ("jpg", "png"):
        raise ValueError(f"fmt must be 'jpg' or 'png', got {fmt!r}")
    h, w = _size(size)
    root = Path(dir)
    params = {
        "classes": classes,
        "per_class": per_class,
        "height": h,
        "width": w,
        "seed": int(seed),
        "fmt": fmt,
        "version": 1,
    }
    marker = root / MARKER
    old = None
    if marker.is_file():
        try:
            old = json.loads(marker.read_text())
        except (OSError, ValueError):
            old = None
    if old == params:
        return root
    if root.exists() and any(root.iterdir()) and not overwrite:
        raise OutputExistsError(
            f"{root} is not empty and was not made by make_sample_data with these settings; "
            "pass overwrite=True (or another folder)"
        )
    if isinstance(old, dict) and isinstance(old.get("classes"), int):
        marker.unlink()
        for c in range(old["classes"]):
            shutil.rmtree(root / _class_dir(c, old["classes"]), ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    for c in range(classes):
        (root / _class_dir(c, classes)).mkdir(exist_ok=True)
    chunk = max(1, min(250, per_class))
    jobs = [
        _Job(os.fspath(root), c, classes, s, min(s + chunk, per_class), h, w, int(seed), fmt)
        for c in range(classes)
        for s in range(0, per_class, chunk)
    ]
    total = classes * per_class
    if n_workers == 1 or total < 500 or len(jobs) == 1:
        for job in jobs:
            _run_job(job)
    else:
        from stoker.pack._procs import pool_context, worker_init

        with ProcessPoolExecutor(
            min(n_workers, len(jobs)),
            mp_context=pool_context(),
            initializer=worker_init,
            initargs=(os.getpid(),),
        ) as pool:
            for _ in pool.map(_run_job, jobs):
                pass
    write_bytes_atomic(marker, json.dumps(params, sort_keys=True).encode())
    return root
