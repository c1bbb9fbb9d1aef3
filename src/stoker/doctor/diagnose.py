"""``diagnose``: measure every stage on this machine and say what bounds the run.

Order of work (each stage bounded to about ``seconds`` and ``sample_size`` samples):
storage (cold, then warm; a folder also against one packed file), decode per decoder (full and
at reduced size), the transforms (and each op of a Compose), stoker's loader at 1..N workers,
the host-to-device copy (CUDA only), the model (``step_time_ms`` or timing ``model``), then the
system checks, the verdict and the ranked changes (see ``stoker.doctor.verdict``). A stage that
cannot run here (no CUDA, a room of stoker not installed, an error) is listed under "not
measured" with the reason; the rest of the report still comes out.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import time
from dataclasses import replace
from typing import Any

import numpy as np

from stoker.doctor import measure as M
from stoker.doctor import system as S
from stoker.doctor import verdict as V
from stoker.doctor.report import SCHEMA, Report

__all__ = ["diagnose", "resolve_model", "resolve_transforms", "worker_counts"]


def worker_counts(n: int) -> list[int]:
    """1, 2, ..., n for n <= 4; then powers of two and n (to bound the run time)."""
    if n <= 4:
        return list(range(1, n + 1))
    ks = [1, 2]
    while ks[-1] * 2 < n:
        ks.append(ks[-1] * 2)
    ks.append(n)
    return ks


def _import_attr(spec: str, what: str) -> Any:
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise ValueError(f"{what} {spec!r}: expected 'module:attribute'")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ValueError(f"{what} {spec!r}: cannot import {mod_name!r} ({e})") from e
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ValueError(f"{what} {spec!r}: {mod_name!r} has no attribute {attr!r}") from e
    return obj


def resolve_transforms(t: Any) -> tuple[Any, str]:
    """``None``/``"none"``, a preset name, ``"module:attr"`` or a transform -> (transform, label)."""
    if t is None:
        return None, "none"
    if isinstance(t, str):
        if t == "none":
            return None, "none"
        if ":" in t:
            obj = _import_attr(t, "--transforms")
            if isinstance(obj, type) or (
                not _is_transform(obj) and callable(obj) and _takes_no_args(obj)
            ):
                obj = obj()
            if not callable(obj):
                raise TypeError(
                    f"--transforms {t!r} is not a transform (a callable taking (img, rng))"
                )
            return obj, t
        try:
            from stoker.transforms.presets import get_preset
        except ImportError as e:
            raise ValueError(
                f"--transforms {t!r}: presets are not available in this install ({e})"
            ) from e
        return get_preset(t), t
    if not callable(t):
        raise TypeError(
            f"transforms must be a Transform, a preset name or 'module:attr', got {type(t).__name__}"
        )
    return t, type(t).__name__


def _is_transform(obj: Any) -> bool:
    try:
        from stoker.transforms.base import Transform
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, Transform)


def _takes_no_args(fn: Any) -> bool:
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in sig.parameters.values()
    )


def resolve_model(model: Any) -> Any:
    """An ``nn.Module``, a callable returning one, or ``"module:attr"`` -> the module."""
    if isinstance(model, str):
        model = _import_attr(model, "--model")
    import torch

    if isinstance(model, torch.nn.Module):
        return model
    if callable(model):
        m = model()
        if isinstance(m, torch.nn.Module):
            return m
        raise TypeError(
            f"--model: calling {model!r} gave {type(m).__name__}, not a torch.nn.Module"
        )
    raise TypeError(
        f"--model must be a torch.nn.Module or a callable returning one, got {type(model).__name__}"
    )


# -- torch-side measurements (torch imported only here) --------------------------------------


def time_model(
    model: Any, *, batch_size: int, shape: tuple[int, ...], seconds: float
) -> dict[str, Any]:
    """Forward + backward of ``model`` on random float32 NCHW batches of the loader's shape."""
    import torch

    m = resolve_model(model)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    m = m.to(dev).train()
    h, w, c = (shape + (1,))[:3] if len(shape) == 2 else shape[:3]
    x = torch.rand(batch_size, c, h, w, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def step() -> None:
        out = m(x)
        t = out if isinstance(out, torch.Tensor) else out[0]
        loss = t.float().mean()
        if loss.requires_grad:
            loss.backward()
            m.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    sync()
    n = 0
    t0 = time.perf_counter()
    while True:
        step()
        n += 1
        if n >= 3 and time.perf_counter() - t0 >= seconds:
            break
    sync()
    step_s = (time.perf_counter() - t0) / n
    return {
        "rate": batch_size / step_s,
        "step_ms": 1e3 * step_s,
        "batch_size": batch_size,
        "source": f"--model timed on {dev.type}, forward+backward on random {tuple(x.shape)} float32",
        "steps": n,
    }


def time_h2d(
    *, batch_size: int, shape: tuple[int, ...], dtype: str, seconds: float
) -> dict[str, Any]:
    """Pinned host batch -> CUDA device copies; samples/s and GB/s."""
    import torch

    tdtype = {"uint8": torch.uint8, "float32": torch.float32, "float16": torch.float16}.get(
        dtype, torch.uint8
    )
    host = torch.empty((batch_size, *shape), dtype=tdtype).pin_memory()
    dev = torch.empty_like(host, device="cuda")
    for _ in range(3):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    n = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(8):
            dev.copy_(host, non_blocking=True)
        n += 8
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= seconds:
            break
    dt = time.perf_counter() - t0
    nbytes = host.numel() * host.element_size()
    return {
        "rate": n * batch_size / dt,
        "gb_per_s": n * nbytes / dt / 1e9,
        "dtype": dtype,
        "pinned": True,
        "device": torch.cuda.get_device_name(0),
    }


def _cuda_state() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    try:
        if torch.cuda.is_available():
            return True, ""
    except Exception as e:  # noqa: BLE001
        return False, f"CUDA query failed: {e}"
    return False, "no CUDA device on this machine"


# -- internals ------------------------------------------------------------------------------


def _pipeline_decoder(t: Any) -> tuple[Any, str]:
    """The loader's own decode step (``Pipeline.decode_image``: scale-on-decode when the
    transforms allow it), or the plain decoder with the reason it could not be built."""
    try:
        from stoker.codecs import DECODED_SPEC
        from stoker.pipeline import Pipeline

        pipe = Pipeline(DECODED_SPEC, transforms=t)
    except ImportError as e:
        return (
            lambda b, _min=None: M.fallback_decode(b)
        ), f"stoker.pipeline is not available ({e})"
    except Exception as e:  # noqa: BLE001 - e.g. a chain without a fixed output shape
        return (
            lambda b, _min=None: M.fallback_decode(b)
        ), f"{type(e).__name__}: {e}; timed the plain decoder"
    return (lambda b, _min=None: pipe.decode_image(b)), ""


class _Steps:
    def __init__(self, total: int, enabled: bool | None) -> None:
        from stoker._core.progress import make_progress

        self.bar = make_progress(total, "stoker doctor", unit="step", enabled=enabled)

    def __call__(self, what: str) -> None:
        self.bar.set_postfix_str(what)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _resize_payloads(
    images: list[np.ndarray], payloads: list[bytes], target: tuple[int, int]
) -> tuple[list[bytes], str]:
    """Re-encode decoded images so that they just cover ``target`` (aspect kept), JPEG q90."""
    import cv2
    import simplejpeg

    out = []
    for img in images:
        h, w = img.shape[:2]
        s = max(target[0] / h, target[1] / w)
        if s >= 1.0:
            small = img
        else:
            small = cv2.resize(
                img,
                (max(target[1], math.ceil(w * s)), max(target[0], math.ceil(h * s))),
                interpolation=cv2.INTER_AREA,
            )
        rgb = np.ascontiguousarray(
            small if small.ndim == 3 else np.repeat(small[..., None], 3, axis=2)
        )
        out.append(simplejpeg.encode_jpeg(rgb, quality=90, colorspace="RGB"))
    a = images[0].shape[:2]
    before = sum(len(b) for b in payloads) / max(1, len(payloads))
    after = sum(len(b) for b in out) / max(1, len(out))
    return (
        out,
        f"{a[0]}x{a[1]} -> about {target[0]}x{target[1]} px, {before / 1e3:.1f} -> {after / 1e3:.1f} kB",
    )


def _loader_source(path: str) -> tuple[Any, bool]:
    """The loader's own source object, opened once for all the worker counts (a folder is
    scanned once); the path itself when that is not possible (the loader reports why)."""
    try:
        from stoker.loader import as_source

        return as_source(path)
    except Exception:  # noqa: BLE001 - the Loader built from the path raises the clear error
        return path, False


def _still_rising(measured: dict[int, float], k: int) -> bool:
    """Did the measured curve still climb at ``k`` (so more workers may help)? With no
    measurement, the model alone decides."""
    if not measured:
        return True
    if k != max(measured):
        return False
    below = [j for j in measured if j < k]
    return not below or measured[k] >= 1.1 * measured[max(below)]


def _core_share(stages: list[M.Stage]) -> float:
    """The share of a core this thread got while runnable, over the stages of the pipeline."""
    cpu = sum(st.cpu_seconds for st in stages)
    queued = sum(st.queue_seconds for st in stages)
    return cpu / (cpu + queued) if cpu + queued > 0 else 1.0


def _most_common_shape(images: list[np.ndarray]) -> tuple[int, ...] | None:
    if not images:
        return None
    shapes: dict[tuple[int, ...], int] = {}
    for im in images:
        shapes[im.shape] = shapes.get(im.shape, 0) + 1
    return max(shapes, key=lambda s: shapes[s])


# -- the whole run ---------------------------------------------------------------------------


def diagnose(
    source: str | os.PathLike[str],
    /,
    *,
    transforms: Any = None,
    batch_size: int = 64,
    step_time_ms: float | None = None,
    model: Any = None,
    workers_max: int | None = None,
    seconds: float = 1.0,
    sample_size: int = 256,
    cache: str = "auto",
    loader: bool = True,
    progress: bool | None = None,
) -> Report:
    """Measure each stage of the input pipeline for ``source`` and return a :class:`Report`.

    - ``transforms``: a transform, a preset name, ``"module:attr"`` or ``None``;
    - ``step_time_ms`` / ``model``: what the model consumes (a step time per batch, or an
      ``nn.Module`` (or callable returning one, or ``"module:attr"``) timed on random batches);
    - ``workers_max``: the loader is measured at 1..N workers (default: usable cores);
    - ``seconds``: time per loader and model measurement (each in-process stage gets a half or
      a quarter of it); ``sample_size``: samples read and decoded;
    - ``cache``: ``"warm"``, ``"cold"`` or ``"auto"`` (warm when the data fits in half of the
      free memory): which read figure the model uses;
    - ``loader``: ``False`` skips the loader runs (predictions only).
    """
    t_start = time.perf_counter()
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if step_time_ms is not None and model is not None:
        raise ValueError("give step_time_ms or model, not both")
    if step_time_ms is not None and not (
        isinstance(step_time_ms, (int, float)) and step_time_ms > 0
    ):
        raise ValueError(f"step_time_ms must be > 0 (milliseconds per batch), got {step_time_ms!r}")
    if not (isinstance(seconds, (int, float)) and 0 < seconds <= 60):
        raise ValueError(f"seconds must be in (0, 60], got {seconds!r}")
    if cache not in ("auto", "warm", "cold"):
        raise ValueError(f"cache must be 'auto', 'warm' or 'cold', got {cache!r}")
    if not isinstance(sample_size, int) or sample_size < 1:
        raise ValueError(f"sample_size must be an int >= 1, got {sample_size!r}")
    cores = S.usable_cores()
    if workers_max is None:
        workers_max = max(1, min(cores, 8))
    if not isinstance(workers_max, int) or isinstance(workers_max, bool) or workers_max < 1:
        raise ValueError(f"workers_max must be an int >= 1, got {workers_max!r}")
    t_obj, t_label = resolve_transforms(transforms)
    path = os.fspath(source)
    ks = worker_counts(workers_max)
    steps = _Steps(7 + (len(ks) if loader else 0), progress)
    half, quarter = seconds / 2, seconds / 4  # in-process stages; loader and model get `seconds`
    not_measured: list[dict[str, str]] = []
    stages: list[M.Stage] = []

    def skip(stage: str, reason: str) -> None:
        not_measured.append({"stage": stage, "reason": reason})

    sample = M.sample_source(path, n=sample_size)
    try:
        # -- storage
        directory = os.path.dirname(os.path.abspath(path.rstrip(os.sep)))
        packed: tuple[M.Stage, M.Stage] | None = None
        if sample.kind == "folder":
            cold, payloads = M.measure_read_files(sample, seconds=seconds, cold=True)
            warm, _ = M.measure_read_files(sample, seconds=half, cold=False)
            stages += [cold, warm]
            packed = M.measure_read_packed(payloads, seconds=half, directory=directory)
            stages += list(packed)
        else:
            cold, payloads = M.measure_read_records(sample, seconds=seconds, cold=True)
            warm, _ = M.measure_read_records(sample, seconds=half, cold=False)
            stages += [cold, warm]
        steps("storage")
        fits = True
        with contextlib.suppress(Exception):
            import psutil

            fits = sample.total_bytes <= 0.5 * psutil.virtual_memory().available
        use_cold = cache == "cold" or (cache == "auto" and not fits)
        cache_note = (
            (
                "cold (asked for)"
                if cache == "cold"
                else f"cold: the data ({sample.total_bytes / 1e9:.1f} GB) does not fit in half the free memory"
            )
            if use_cold
            else (
                "warm (asked for)"
                if cache == "warm"
                else "warm: the data fits in memory, so after the first epoch it is read from the page cache"
            )
        )
        if cold.rate > 0 and warm.rate > 0 and cold.per_sample_s < 1.25 * warm.per_sample_s:
            cache_note += (
                "; cold and warm reads came out alike: the storage is memory-backed or the "
                "kernel kept the pages (cold figures are then optimistic)"
            )
        read_stage = cold if use_cold else warm

        # -- decode
        decs = M.decoders()
        pipeline_decode, pipe_note = _pipeline_decoder(t_obj)
        if pipe_note:
            skip("decode (loader pipeline)", pipe_note)
        full: list[np.ndarray] = []  # full size: the image as stored
        images: list[np.ndarray] = []  # as the loader decodes it (maybe at reduced scale)
        good: list[bytes] = []
        for b in payloads:
            try:
                full.append(M.fallback_decode(b))
                images.append(pipeline_decode(b, None))
                good.append(b)
            except Exception as e:  # noqa: BLE001 - a bad sample must not stop the doctor
                skip("decode", f"a sampled payload did not decode, left out: {e}")
        payloads = good
        dec_main: M.Stage | None = None
        for name, fn in decs.items():
            try:
                st = M.measure_decode(name, fn, payloads, seconds=quarter)
            except Exception as e:  # noqa: BLE001
                skip(f"decode {name}", f"{type(e).__name__}: {e}")
                continue
            if st is not None:
                stages.append(st)
        try:
            dec_main = M.measure_decode("loader pipeline", pipeline_decode, payloads, seconds=half)
        except Exception as e:  # noqa: BLE001
            skip("decode (loader pipeline)", f"{type(e).__name__}: {e}")
        if dec_main is not None:
            stages.append(dec_main)
        steps("decode")

        # -- transforms
        in_shape = _most_common_shape(full)
        outputs: list[np.ndarray] = images
        aug: M.Stage | None = None
        breakdown: list[tuple[str, float, float]] = []
        if t_obj is not None and images:
            try:
                aug, breakdown, outputs = M.measure_transforms(t_obj, images, seconds=half)
                stages.append(aug)
            except Exception as e:  # noqa: BLE001
                skip("augment", f"the transforms failed on a sample: {type(e).__name__}: {e}")
        out_shape = _most_common_shape(outputs)
        out_dtype = str(outputs[0].dtype) if outputs else "uint8"
        target: tuple[int, int] | None = None
        if in_shape and out_shape and len(out_shape) >= 2 and t_obj is not None:
            oh, ow = out_shape[0], out_shape[1]
            if oh * ow < 0.7 * in_shape[0] * in_shape[1]:
                target = (oh, ow)
        steps("augment")

        # -- scale-on-decode and resize-at-pack alternatives
        dec_scaled: M.Stage | None = None
        resized_cost: tuple[float, float, float, float, str] | None = None
        if target is not None:
            for name, fn in decs.items():
                with contextlib.suppress(Exception):
                    st = M.measure_decode(name, fn, payloads, seconds=quarter, min_size=target)
                    if st is not None:
                        stages.append(st)
                        if dec_scaled is None or st.per_sample_s < dec_scaled.per_sample_s:
                            dec_scaled = st
            try:
                small, label = _resize_payloads(full, payloads, target)
                d2 = M.measure_decode(
                    "resized at pack time", pipeline_decode, small, seconds=quarter
                )
                small_imgs = [pipeline_decode(b, None) for b in small]
                a2, _, _ = M.measure_transforms(t_obj, small_imgs, seconds=quarter)
                if d2 is not None:
                    stages.append(d2)
                    resized_cost = (
                        d2.per_sample_s,
                        d2.cpu_per_sample_s,
                        a2.per_sample_s,
                        a2.cpu_per_sample_s,
                        label,
                    )
            except Exception as e:  # noqa: BLE001
                skip("resize at pack time", f"{type(e).__name__}: {e}")
        steps("alternatives")

        assemble = M.measure_assemble(outputs, batch_size=batch_size, seconds=quarter)
        if assemble is not None:
            stages.append(assemble)
        used = [st for st in (read_stage, dec_main, aug, assemble) if st is not None]
        cost = V.Cost(
            read_stage.per_sample_s,
            read_stage.cpu_per_sample_s,
            dec_main.per_sample_s if dec_main else 0.0,
            dec_main.cpu_per_sample_s if dec_main else 0.0,
            aug.per_sample_s if aug else 0.0,
            aug.cpu_per_sample_s if aug else 0.0,
            _core_share(used),
            assemble_s=assemble.per_sample_s if assemble else 0.0,
            assemble_cpu_s=assemble.cpu_per_sample_s if assemble else 0.0,
        )

        # -- loader
        runs: list[M.LoaderRun] = []
        if loader:
            src_obj, owned = _loader_source(path)
            try:
                for k in ks:
                    try:
                        runs.append(
                            M.measure_loader(
                                src_obj,
                                workers=k,
                                batch_size=batch_size,
                                transforms=t_obj,
                                seconds=seconds,
                            )
                        )
                    except Exception as e:  # noqa: BLE001 - report, do not crash
                        reason = (
                            f"stoker.Loader is not available ({e})"
                            if isinstance(e, ImportError)
                            else f"{type(e).__name__}: {e}"
                        )
                        skip(f"loader ({k} workers)", reason)
                        break
                    finally:
                        steps(f"loader {k}")
            finally:
                if owned:
                    with contextlib.suppress(Exception):
                        src_obj.close()
        else:
            skip("loader", "skipped on request; rates are predictions")
        measured = {r.workers: r.rate for r in runs}
        # e comes from the one-worker run; the loader reads through the page cache when the
        # doctor's own reads have just warmed it, so a loader faster than the cold figure
        # allows is calibrated against the warm one
        cost_warm = replace(cost, read_s=warm.per_sample_s, read_cpu_s=warm.cpu_per_sample_s)
        m1 = measured.get(1)
        mains = [r.main_cpu_per_sample_s for r in runs if r.workers == 1]
        if mains:
            cost = replace(cost, main_cpu_s=mains[0])
        loader_warm = use_cold and m1 is not None and m1 * cost.total_s > 1.1
        eff = V.calibrate(cost_warm if loader_warm else cost, m1)
        pred_ks = sorted(set(ks) | {2 * workers_max})
        predicted = {k: V.predict(cost, k, cores=cores, efficiency=eff) for k in pred_ks}
        if loader_warm:
            cache_note += (
                "; the loader runs read from the page cache, so their rates are above the "
                "cold-cache predictions"
            )

        # -- host-to-device and model
        h2d: dict[str, Any] | None = None
        h2d_uint8: float | None = None
        has_cuda, why = _cuda_state()
        sample_shape = tuple(out_shape) if out_shape else (0,)
        if has_cuda and out_shape:
            try:
                h2d = time_h2d(
                    batch_size=batch_size, shape=sample_shape, dtype=out_dtype, seconds=seconds / 2
                )
                if out_dtype != "uint8":
                    h2d_uint8 = time_h2d(
                        batch_size=batch_size,
                        shape=sample_shape,
                        dtype="uint8",
                        seconds=seconds / 2,
                    )["rate"]
            except Exception as e:  # noqa: BLE001
                skip("host-to-device", f"{type(e).__name__}: {e}")
        else:
            skip("host-to-device", why or "no sample shape")
        steps("host-to-device")
        model_info: dict[str, Any] | None = None
        if step_time_ms is not None:
            model_info = {
                "rate": batch_size / (step_time_ms / 1e3),
                "step_ms": float(step_time_ms),
                "batch_size": batch_size,
                "source": "--step-time",
            }
        elif model is not None:
            if not out_shape:
                skip("model", "no decoded sample to take the batch shape from")
            else:
                try:
                    model_info = time_model(
                        model, batch_size=batch_size, shape=tuple(out_shape), seconds=seconds
                    )
                except ImportError as e:
                    skip("model", f"timing --model needs torch ({e})")
                except RuntimeError as e:  # the model refused the batch (shape, device, ...)
                    skip(
                        "model",
                        f"the model failed on a random batch of {batch_size} x "
                        f"{'x'.join(map(str, out_shape))} (as NCHW float32): {e}",
                    )
        else:
            skip("model", "give --step-time MS or --model module:attr for the GPU busy share")
        steps("model")

        # -- system
        sample_bytes = int(np.prod(sample_shape)) * np.dtype(out_dtype).itemsize if out_shape else 0
        slots = 4  # the loader's ring: prefetch (2) + 2 slots
        worker_threads = list(runs[-1].worker_threads) if runs else None
        start_method = runs[-1].start_method if runs else None
        checks = [
            S.check_shm(
                need_bytes=slots * batch_size * sample_bytes,
                what=f"a ring of {slots} batch slots of {batch_size} x {sample_bytes / 1e3:.0f} kB",
            ),
            S.check_ulimit(workers=workers_max),
            S.check_cores(workers=workers_max, cores=cores),
            S.check_threads(workers=workers_max, cores=cores, worker_threads=worker_threads),
            S.check_start_method(loader_method=start_method),
            S.check_load(cores=cores),
        ]

        # -- verdict and changes
        # the run is judged at the best measured worker count (what a user would pick)
        k_run = max(measured, key=lambda k: (measured[k], -k)) if measured else workers_max
        loader_rate = predicted.get(k_run) or V.predict(cost, k_run, cores=cores, efficiency=eff)
        if k_run in measured and not loader_warm:
            loader_rate = measured[k_run]
        h2d_rate = h2d["rate"] if h2d else None
        model_rate = model_info["rate"] if model_info else None
        verdict = V.verdict(
            cost,
            workers=k_run,
            cores=cores,
            efficiency=eff,
            loader_rate=loader_rate,
            h2d_rate=h2d_rate,
            model_rate=model_rate,
            predicted_rate=predicted.get(k_run),
        )
        if measured and k_run < max(measured):
            k_top = max(measured)
            verdict = replace(
                verdict,
                text=verdict.text
                + f" More workers did not help here: {k_top} gave {measured[k_top]:,.0f} samples/s"
                f" (more busy processes than free cores: see the load and cores checks).",
            )
        normalize = None
        costly = None
        if breakdown and aug is not None:
            total_ops = sum(w for _, w, _ in breakdown) or 1.0
            last_name = type(M.transform_ops(t_obj)[-1]).__name__
            candidates = list(breakdown)
            if last_name == "Normalize" and out_dtype != "uint8":
                normalize = (breakdown[-1][1], breakdown[-1][2], h2d_uint8)
                candidates = candidates[:-1]  # offered as "uint8 + GPU normalisation"
            if candidates:
                name, w, c = max(candidates, key=lambda x: x[1])
                if w / total_ops >= 0.25 and cost.total_s > 0 and w / cost.total_s >= 0.1:
                    costly = (name, w, c, w / total_ops)
        elif aug is not None:
            if out_dtype != "uint8" and type(t_obj).__name__ == "Normalize":
                normalize = (aug.per_sample_s, aug.cpu_per_sample_s, h2d_uint8)
            elif cost.total_s > 0 and aug.per_sample_s / cost.total_s >= 0.25:
                # one opaque transform: estimate what halving its cost would give
                costly = (t_label, aug.per_sample_s / 2, aug.cpu_per_sample_s / 2, 1.0)
        recs = V.recommend(
            cost,
            workers=k_run,
            cores=cores,
            efficiency=eff,
            loader_rate=loader_rate,
            h2d_rate=h2d_rate,
            model_rate=model_rate,
            packed_read=(
                (
                    (packed[0] if use_cold else packed[1]).per_sample_s,
                    (packed[0] if use_cold else packed[1]).cpu_per_sample_s,
                )
                if packed
                else None
            ),
            decode_scaled=(
                (dec_scaled.per_sample_s, dec_scaled.cpu_per_sample_s, f"{dec_scaled.name}")
                if dec_scaled
                else None
            ),
            resized=resized_cost,
            normalize=normalize,
            costly_op=costly,
            more_workers=2 * k_run if _still_rising(measured, k_run) else None,
        )
        steps("verdict")
    finally:
        sample.close()
        steps.close()

    import stoker

    data: dict[str, Any] = {
        "schema": SCHEMA,
        "stoker_version": stoker.__version__,
        "source": {
            "path": path,
            "kind": sample.kind,
            "count": sample.count,
            "total_bytes": sample.total_bytes,
            "sampled": len(payloads),
            "image_shape": "x".join(map(str, in_shape)) if in_shape else None,
            "output_shape": list(out_shape) if out_shape else None,
            "output_dtype": out_dtype,
        },
        "settings": {
            "batch_size": batch_size,
            "transforms": t_label,
            "workers_max": workers_max,
            "workers": ks,
            "cores": cores,
            "seconds": seconds,
            "sample_size": sample_size,
            "cache": cache,
        },
        "system": [c.to_dict() for c in checks],
        "stages": [s.to_dict() for s in stages],
        "pipeline": {
            **cost.to_dict(),
            "other_threads": cost.others(cores),
            "one_worker_rate": cost.one_worker_rate,
            "cache": "cold" if use_cold else "warm",
            "cache_note": cache_note,
            "read_from": read_stage.name,
            "decode_with": dec_main.name if dec_main else None,
            "augment_ops": [{"op": n, "ms": 1e3 * w, "cpu_ms": 1e3 * c} for n, w, c in breakdown],
        },
        "loader": {
            "measured": [
                {
                    "workers": r.workers,
                    "rate": r.rate,
                    "startup_s": r.startup_s,
                    "samples": r.samples,
                    "seconds": r.seconds,
                }
                for r in runs
            ],
            "predicted": [{"workers": k, "rate": v} for k, v in sorted(predicted.items())],
            "efficiency": eff,
            "model": "predicted(k) = min(e * k / (b + c / s_k), s_k / m), s_k = min(1, C / (L + k))",
        },
        "h2d": h2d,
        "model": model_info,
        "verdict": verdict.to_dict(),
        "recommendations": [r.to_dict() for r in recs],
        "not_measured": not_measured,
        "elapsed_s": time.perf_counter() - t_start,
    }
    return Report(data)
