"""Seed 002 in one run: images/s through Keras 3 ``model.fit`` of a tiny model.

Same arrays (synthetic 64x64 glyphs in RAM), same batches (half original, half distorted),
same model for every candidate; each candidate runs in its own subprocess under a timeout:

  a  keras PyDataset doing the seed's PIL distortions, workers=N threads
  b  the same with use_multiprocessing=True (reported as "hung" when it hangs)
  c  the seed's fix: a multiprocessing.Pool of N processes over arrays in shared memory
  d  stoker: Loader((x, y), pair_with=kanji_distort(64), workers=N) -> KerasDataset
  d_pil  stoker with the seed's PIL distortion as its pair_with transform (same ops as a-c)
  ceiling  the model alone on a ready batch: the most any input pipeline can reach

The model is tiny so that the input pipeline bounds the speed. images/s is measured in
steady state, from the end of the first training batch to the end of the last; CPU us/img
is the CPU time of the candidate and all its child processes over the same span, per image
(on a busy machine it says more than images/s, which depends on the CPU share each process
tree gets); the fit column is the whole call including the start of pools and workers. The
training process runs torch with one thread in every candidate. Candidates run in rounds
(round-robin) and the best round of each is shown, so that a busy spell on a shared machine
does not fall on one candidate only.

    python bench/bench_keras.py [--quick] [--workers 2] [--repeat 2]

``--quick`` (a smoke run: 1024 samples, 1 epoch) runs a, c and d only (``--only`` names
others): each candidate's start (keras and torch imported in a fresh process) is most of its
time, and ``b``, when it hangs, would hold the run for its whole timeout.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _common import cpu_between, cpu_count, tree_cpu

os.environ.setdefault("KERAS_BACKEND", "torch")

HERE = Path(__file__).resolve().parent
SIZE = 64


def make_glyphs(n: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The example's glyph generator (examples/keras_kanji.py), loaded by path."""
    spec = importlib.util.spec_from_file_location(
        "keras_kanji", HERE.parent / "examples" / "keras_kanji.py"
    )
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.make_glyphs(n, classes=classes, size=SIZE)


# --- the seed's distortion, written out (PIL), with an explicit random generator ----------
def distort_sample(img, rng: np.random.Generator):
    """Seed 002's ``distort_sample``: one of sine/rotate/shear/scale, one of blur/sharpen/smooth."""
    from PIL import Image as PImage
    from PIL import ImageFilter

    t = ("sine", "rotate", "shear", "scale")[int(rng.integers(4))]
    f = ("blur", "sharpen", "smooth")[int(rng.integers(3))]
    if t == "rotate":
        img = img.rotate(rng.uniform(-15, 15))
    if t == "shear":
        y_shear = rng.uniform(-0.2, 0.2)
        x_shear = rng.uniform(-0.2, 0.2)
        img = img.transform(img.size, PImage.AFFINE, (1, x_shear, 0, y_shear, 1, 0))
    if t == "scale":
        size_x = int(rng.integers(25, 63))
        size_y = int(rng.integers(25, 63))
        img = img.resize((size_x, size_y))
        background = PImage.new("L", (SIZE, SIZE))
        trans_x = int(rng.integers(0, math.floor(SIZE - size_x)))
        trans_y = int(rng.integers(0, math.floor(SIZE - size_y)))
        background.paste(img, (trans_x, trans_y))
        img = background
    if t == "sine":
        t_img = np.array(img)
        a = t_img.shape[0] / 3.0
        w = 2.0 / t_img.shape[1]
        shift_factor = (-1, 1)[int(rng.integers(2))] * rng.uniform(0.15, 0.2)
        for i in range(t_img.shape[0]):
            shift = shift_factor * a * np.sin(-2 * np.pi * i * w)
            t_img[:, i] = np.roll(t_img[:, i], int(shift))
        img = PImage.fromarray(t_img)
    if f == "blur":
        img = img.filter(ImageFilter.GaussianBlur(radius=rng.uniform(0.5, 1.2)))
    if f == "sharpen":
        img = img.filter(ImageFilter.SHARPEN)
    if f == "smooth":
        img = img.filter(ImageFilter.SMOOTH)
    return img


def seed_pair(base: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One source sample as the seed feeds it: (distorted, original), float16 in 0..1."""
    from PIL import Image as PImage

    img = PImage.fromarray(np.uint8(base.reshape(SIZE, SIZE) * 255))
    out = np.asarray(distort_sample(img, rng), np.float16).reshape(SIZE, SIZE, 1) / 255
    return out, base


def pil_distort(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The seed's distortion as a stoker transform (uint8 HW in, uint8 HW out)."""
    from PIL import Image as PImage

    return np.asarray(distort_sample(PImage.fromarray(img), rng))


# --- candidates a/b: a keras PyDataset doing the work ---------------------------------------
def _seed_dataset_class():
    import keras

    class SeedDataset(keras.utils.PyDataset):
        """The seed's DataGenerator: batch i = samples [i*B/2, (i+1)*B/2), distorted + original."""

        def __init__(self, x, y, batch_size, **kwargs):
            super().__init__(**kwargs)
            self.x, self.y, self.half = x, y, batch_size // 2

        def __len__(self):  # the seed's len(x) // batch_size covered half the data
            return len(self.x) // self.half

        def __getitem__(self, index):
            rng = np.random.default_rng([index, os.getpid()])
            xs, ys = [], []
            for i in range(index * self.half, (index + 1) * self.half):
                d, b = seed_pair(self.x[i], rng)
                xs += [d, b]
                ys += [self.y[i], self.y[i]]
            return np.array(xs, np.float16), np.array(ys)

    return SeedDataset


# --- candidate c: the seed's Pool with shared arrays ------------------------------------------
_shared: dict = {}


def _pool_init(x_raw, y_raw, x_shape, y_shape):
    _shared["x"] = np.frombuffer(x_raw, dtype=np.float16).reshape(x_shape)
    _shared["y"] = np.frombuffer(y_raw, dtype=np.int64).reshape(y_shape)


def _pool_slice(start: int, end: int):
    rng = np.random.default_rng([start, os.getpid()])
    xs, ys = [], []
    for i in range(start, end):
        d, b = seed_pair(_shared["x"][i], rng)
        xs += [d, b]
        ys += [_shared["y"][i], _shared["y"][i]]
    return xs, ys


def _pool_dataset_class():
    import keras

    class PoolDataset(keras.utils.PyDataset):
        """The seed's fix: each batch split into N slices, one per pool process (starmap)."""

        def __init__(self, pool, n, batch_size, processes, **kwargs):
            super().__init__(**kwargs)
            self.pool, self.n, self.half, self.processes = pool, n, batch_size // 2, processes

        def __len__(self):
            return self.n // self.half

        def __getitem__(self, index):
            step = self.half // self.processes
            start = index * self.half
            args = [(start + k * step, start + (k + 1) * step) for k in range(self.processes)]
            xs, ys = [], []
            for a, b in self.pool.starmap(_pool_slice, args):
                xs += a
                ys += b
            return np.array(xs, np.float16), np.array(ys)

    return PoolDataset


# --- one candidate, in its own process ----------------------------------------------------------
def _model(classes: int):
    import keras

    model = keras.Sequential(
        [
            keras.Input((SIZE, SIZE, 1)),
            keras.layers.AveragePooling2D(8),
            keras.layers.Flatten(),
            keras.layers.Dense(classes),
        ]
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.train_on_batch(np.zeros((2, SIZE, SIZE, 1), np.float16), np.zeros(2, np.int64))
    return model


def _timed_fit(model, data, epochs: int, batch_size: int) -> dict:
    import keras

    marks: list[float] = []
    cpu: list[dict[int, float]] = []  # the tree's CPU (the loader's workers are grandchildren)

    class Mark(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            marks.append(time.perf_counter())
            if batch == 0 and len(cpu) == 0:
                cpu.append(tree_cpu())

        def on_train_end(self, logs=None):
            cpu.append(tree_cpu())

    t0 = time.perf_counter()
    model.fit(data, epochs=epochs, verbose=0, callbacks=[Mark()], shuffle=False)
    total = time.perf_counter() - t0
    images = (len(marks) - 1) * batch_size
    steady = images / (marks[-1] - marks[0])
    used = cpu_between(cpu[0], cpu[1])
    return {
        "images_s": steady,
        "fit_s": total,
        "batches": len(marks),
        "cpu_us": used / images * 1e6,
    }


class _Ceiling:
    """The model's own bound: the same ready batch every step, no input work at all."""

    @staticmethod
    def dataset(x, y, bs):
        import keras

        class Ready(keras.utils.PyDataset):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.xb = np.concatenate([x[: bs // 2]] * 2)
                self.yb = np.concatenate([y[: bs // 2]] * 2)

            def __len__(self):
                return len(x) // (bs // 2)

            def __getitem__(self, index):
                return self.xb, self.yb

        return Ready()


def run_candidate(name: str, args: argparse.Namespace) -> dict:
    import keras

    if keras.backend.backend() == "torch":
        import torch

        # One trainer thread: on a small machine torch's OpenMP threads otherwise spin against
        # the input workers (the same setting for every candidate).
        torch.set_num_threads(1)
    x_u8, y = make_glyphs(args.n, args.classes)
    x = (x_u8.astype(np.float16) / 255).reshape(-1, SIZE, SIZE, 1)  # the seed's float16 arrays
    model = _model(args.classes)
    bs, w = args.batch_size, args.workers
    if name == "ceiling":
        return _timed_fit(model, _Ceiling.dataset(x, y, bs), args.epochs, bs)
    if name in ("a", "b"):
        ds = _seed_dataset_class()(
            x, y, bs, workers=w, use_multiprocessing=(name == "b"), max_queue_size=10
        )
        return _timed_fit(model, ds, args.epochs, bs)
    if name == "c":
        x_raw = mp.RawArray("b", x.nbytes)
        y_raw = mp.RawArray("b", y.nbytes)
        np.frombuffer(x_raw, np.float16)[:] = x.ravel()
        np.frombuffer(y_raw, np.int64)[:] = y
        with mp.Pool(w, initializer=_pool_init, initargs=(x_raw, y_raw, x.shape, y.shape)) as pool:
            ds = _pool_dataset_class()(pool, args.n, bs, w)
            return _timed_fit(model, ds, args.epochs, bs)
    if name in ("d", "d_pil"):
        import stoker
        from stoker.keras import KerasDataset
        from stoker.transforms import as_transform
        from stoker.transforms.presets import kanji_distort

        pair = kanji_distort(SIZE) if name == "d" else as_transform(pil_distort, output="same")
        loader = stoker.Loader(
            (x_u8, y), batch_size=bs, pair_with=pair, seed=0, workers=w, prefetch=args.prefetch
        )
        with KerasDataset(loader, x_dtype="float16") as ds:
            return _timed_fit(model, ds, args.epochs, bs)
    raise ValueError(f"unknown candidate {name!r}")


def _run_subprocess(name: str, args: argparse.Namespace, timeout: float) -> dict | str:
    """Run one candidate in a fresh process; its result, or why there is none."""
    cmd = [sys.executable, __file__, "--candidate", name]
    cmd += ["--n", str(args.n), "--epochs", str(args.epochs), "--workers", str(args.workers)]
    cmd += ["--batch-size", str(args.batch_size), "--classes", str(args.classes)]
    cmd += ["--prefetch", str(args.prefetch)]
    # Own session, so that a hung candidate and every process it forked can be killed.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return f"hung (killed after {timeout:.0f} s)"
    line = [s for s in stdout.splitlines() if s.startswith("RESULT ")]
    if proc.returncode == 0 and line:
        return json.loads(line[-1][len("RESULT ") :])
    tail = (stderr or stdout).strip().splitlines()[-1:] or ["?"]
    return f"failed (exit {proc.returncode}): {tail[0][:80]}"


def distortion_costs(classes: int, n: int = 1000) -> dict[str, float]:
    """Microseconds per image of each distortion, measured here in one process."""
    from stoker.transforms.presets import kanji_distort

    x, _ = make_glyphs(n, classes)
    out = {}
    for name, fn in (("stoker kanji_distort", kanji_distort(SIZE)), ("seed PIL", pil_distort)):
        rng = np.random.default_rng(0)
        fn(x[0], rng)
        t0 = time.perf_counter()
        for img in x:
            fn(img, rng)
        out[name] = (time.perf_counter() - t0) / n * 1e6
    return out


CANDIDATES = {
    "ceiling": "model alone (ready batches, no input)",
    "a": "keras PyDataset, {w} threads",
    "b": "keras PyDataset, multiprocessing, {w} procs",
    "c": "seed's Pool + shared arrays, {w} procs",
    "d": "stoker KerasDataset, {w} workers",
    "d_pil": "stoker, seed's PIL ops, {w} workers",
}


#: the candidates of a --quick run: the ratio the target is about (d against a and c); each
#: candidate is a fresh process that imports keras and torch, the most of a quick run's time
QUICK = ("a", "c", "d")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (``--quick`` for a short smoke run); ``argv``: as for argparse."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1024 samples, 1 epoch, 60 s timeout, candidates a, c and d only (b may hang)",
    )
    ap.add_argument("--workers", type=int, default=2, help="threads/processes/workers (default 2)")
    ap.add_argument("--n", type=int, default=None, help="source samples (default 8192; 1024 quick)")
    ap.add_argument("--epochs", type=int, default=None, help="default 3 (1 with --quick)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--prefetch", type=int, default=2, help="stoker's prefetch (default 2)")
    ap.add_argument("--classes", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=None, help="seconds per candidate")
    ap.add_argument("--only", action="append", default=[], help="candidate (repeatable)")
    ap.add_argument(
        "--repeat", type=int, default=None, help="rounds; best of each (default 2; 1 quick)"
    )
    ap.add_argument("--candidate", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.n = args.n or (1024 if args.quick else 8192)
    args.epochs = args.epochs or (1 if args.quick else 3)
    args.repeat = args.repeat or (1 if args.quick else 2)
    if args.candidate:
        print("RESULT " + json.dumps(run_candidate(args.candidate, args)), flush=True)
        return 0

    timeout = args.timeout or (60 if args.quick else 300)
    print(
        f"seed 002: {args.n} glyphs 64x64 in RAM, batch {args.batch_size} "
        f"(half original, half distorted), {args.epochs} epochs, {args.workers} workers, "
        f"{args.n // (args.batch_size // 2) * args.batch_size} images/epoch, "
        f"timeout {timeout:.0f} s per candidate, "
        f"{cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start, "
        f"best of {args.repeat} round(s)"
    )
    results: dict[str, dict | str] = {}
    names = args.only or (list(QUICK) if args.quick else list(CANDIDATES))
    for rnd in range(args.repeat):  # round-robin, so that a busy spell hits every candidate
        for name in names:
            if isinstance(results.get(name), str):
                continue  # hung or failed once: not again
            t0 = time.perf_counter()
            r = _run_subprocess(name, args, timeout)
            best = results.get(name)
            if not isinstance(best, dict) or isinstance(r, str) or r["images_s"] > best["images_s"]:
                results[name] = r
            print(f"  round {rnd + 1}, {name}: {time.perf_counter() - t0:.0f} s", flush=True)

    op_costs = distortion_costs(args.classes)
    baseline = max(
        (r["images_s"] for k, r in results.items() if k in ("a", "b", "c") and isinstance(r, dict)),
        default=None,
    )
    print(
        f"\n{'candidate':<50} {'images/s':>9} {'CPU us/img':>10} {'fit s':>7} {'vs best a-c':>12}"
    )
    for name, r in results.items():
        label = f"{name:<8}" + CANDIDATES[name].format(w=args.workers)
        if isinstance(r, str):
            print(f"{label:<50} {r}")
            continue
        ratio = f"{r['images_s'] / baseline:.2f}x" if baseline and name != "ceiling" else "-"
        print(
            f"{label:<50} {r['images_s']:>9.0f} {r['cpu_us']:>10.0f} {r['fit_s']:>7.1f} {ratio:>12}"
        )
    print(
        "\ndistortion cost, one process, per distorted image: "
        + ", ".join(f"{k} {v:.0f} us" for k, v in op_costs.items())
    )
    d = results.get("d")
    if baseline and isinstance(d, dict):
        verdict = "met" if d["images_s"] >= 1.5 * baseline else "NOT met"
        print(f"\ntarget d >= 1.5 x best of a-c: {d['images_s'] / baseline:.2f}x ({verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
