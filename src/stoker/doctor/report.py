"""The doctor's report: :class:`Findings` as one JSON-safe dict, rendered as text or JSON (the
chart is :mod:`stoker.doctor.chart`).

JSON schema ``stoker.doctor/2``; rates are samples per second, times per sample in ms. A figure
the model gives rather than a measurement says so: ``loader.predicted`` and
``loader.measured[].given_load`` are predictions, the verdict's ``loader_basis`` says which
its ``loader_rate`` is, and a recommendation's ``basis`` which figures its change uses. The
top-level keys, in order (:data:`SECTIONS`):

- ``schema``: ``"stoker.doctor/2"``; ``stoker_version``;
- ``source``: path, kind (folder|records), count, total_bytes (estimated for a folder),
  sampled (payloads that decoded), image_shape ("HxWxC" or null), output_shape (list or
  null), output_dtype; remote: null, or for a set in object storage {url, shard (the one
  downloaded without the cache), shard_bytes, download_s, mb_per_s, ttfb_ms, samples_per_s
  (records/s the download rate delivers), cache_dir, cache_limit, cache_used, cache_free,
  set_bytes (what the cache holds of the set), shards, largest_shard_bytes, shuffle
  (true|shards), window, prefetch_shards, shards_need (bytes shuffle="shards" keeps cached),
  holds_set, bounds (whether the cache bounds the run), skipped (why the download was not
  measured, or ""), text};
- ``settings``: batch_size, transforms (label), workers_max, workers (the counts run), cores,
  seconds, sample_size, cache (auto|warm|cold);
- ``corrupt``: the samples training would stop at: count (corrupt: they did not read or
  decode), failed (they decoded but a transform or shape check failed), unit (file|record),
  items (list of {key, where, reason, found_by read|decode|loader, kind corrupt|pipeline}),
  checked ({decode, loader, of}:
  samples the doctor's sample and the longest loader run went through, of the set), exhaustive,
  max_bad_fraction (the Loader's default), allowed_per_epoch, text ("" when none);
- ``system``: list of checks: name, status ok|warn|fail, message, data;
- ``stages``: list: name, stage (storage|decode|augment|loader), rate, per_sample_ms,
  cpu_per_sample_ms, queue_per_sample_ms, mb_per_s, samples, seconds, note, interval_ms
  ([lo, hi] around per_sample_ms, the rounds' median), tight, rounds;
- ``pipeline``: one worker's cost: read_ms, decode_ms, augment_ms, assemble_ms, total_ms,
  cpu_ms, queue_ms, core_share, main_cpu_ms, blocked_ms, cpu_share; other_threads (``L``),
  one_worker_rate, cache (cold|warm), cache_note, read_from and decode_with (stage names),
  augment_ops (list of {op, ms, cpu_ms});
- ``loader``: measured (list of {workers, rate, startup_s, samples, seconds, skipped, load,
  given_load}: ``skipped`` the samples the run left out (a bad file counts once per epoch it
  was met in); ``load`` null or {cores, others_cores, steal_cores, free_cores, load1}, what
  other processes took of the usable cores over that run's window; ``given_load`` null or
  the model's prediction with the cores they left free), predicted (list of {workers, rate}:
  the model's predictions), efficiency, model (the formula), assumption (what the prediction
  assumes of the machine's load, in words);
- ``h2d``: null or {rate, gb_per_s, dtype, pinned, device};
- ``model``: null or {rate, step_ms, batch_size, source[, steps]};
- ``verdict``: bound, workers, loader_rate, loader_basis (measured|predicted), h2d_rate,
  model_rate, delivered, gpu_busy_share, cpu_capped, shares, decided (false when the two
  largest parts' intervals overlap), runner_up (the second-largest part), intervals_ms
  ({part: [lo, hi]}), text;
- ``recommendations``: best first: action, detail, basis (measured|estimated),
  changes_data (a trade: the model sees other data), gain_lo (a measured change's gain at
  the least favourable ends of its figures' intervals; one at or below 1 is not ranked but
  listed under not_measured), loader_before, loader_after, loader_gain, delivered_before,
  delivered_after, gain;
- ``not_measured``: list of {stage, reason};
- ``budget``: seconds (the run's budget), spent_s (after start-up), startup_s (imports,
  opening SOURCE, the loader's process server), tight (the target half-width of an interval,
  a share of its figure), ended (tight|budget: every interval came out tight, or the budget ran
  out first), loose (list of {name, ms, lo_ms, hi_ms, width}), cut (the stages it left out);
- ``elapsed_s``.

Infinities and NaN are written as null. :meth:`Report.from_json` also reads version 1
reports (no ``corrupt`` section, no load figures).
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from importlib import metadata
from typing import Any

from stoker.doctor.budget import budget_data, budget_line
from stoker.doctor.corrupt import corrupt_data
from stoker.doctor.findings import Findings
from stoker.doctor.measure.storage import size_text
from stoker.doctor.verdict import assumption, headline

__all__ = ["SCHEMA", "SCHEMAS_READ", "SECTIONS", "Report", "report_data"]

SCHEMA = "stoker.doctor/2"
#: the versions :meth:`Report.from_json` reads
SCHEMAS_READ = ("stoker.doctor/1", SCHEMA)

SECTIONS = (
    "schema",
    "stoker_version",
    "source",
    "settings",
    "corrupt",
    "system",
    "stages",
    "pipeline",
    "loader",
    "h2d",
    "model",
    "verdict",
    "recommendations",
    "not_measured",
    "budget",
    "elapsed_s",
)

#: the throughput model, as the report states it (see stoker.doctor.verdict)
MODEL = "predicted(k) = min(e * k / (b + c / s_k), s_k / m), s_k = min(1, C / (L + k))"


# -- Findings -> data -------------------------------------------------------------------------


def report_data(f: Findings, *, elapsed_s: float, startup_s: float = 0.0) -> dict[str, Any]:
    """The report's dict (schema above) from a finished run's findings."""
    try:
        version = metadata.version("stoker")
    except metadata.PackageNotFoundError:  # a source tree that was never installed
        version = "unknown"
    j = f.judgement
    return {
        "schema": SCHEMA,
        "stoker_version": version,
        "source": _source(f),
        "settings": _settings(f),
        "corrupt": corrupt_data(f),
        "system": [c.to_dict() for c in f.checks],
        "stages": [s.to_dict() for s in f.stages],
        "pipeline": _pipeline(f),
        "loader": _loader(f),
        "h2d": f.h2d.result,
        "model": f.model,
        "verdict": j.verdict.to_dict(),
        "recommendations": [r.to_dict() for r in j.recommendations],
        "not_measured": f.not_measured,
        "budget": budget_data(f, elapsed_s, startup_s),
        "elapsed_s": elapsed_s,
    }


def _source(f: Findings) -> dict[str, Any]:
    from stoker.storage.urls import redact

    sample, aug = f.sample, f.augment
    remote = getattr(f.storage, "remote", None)
    return {
        "path": redact(f.settings.path),
        "kind": sample.kind,
        "count": sample.count,
        "total_bytes": sample.total_bytes,
        "sampled": len(f.decode.payloads),
        "image_shape": "x".join(map(str, aug.in_shape)) if aug.in_shape else None,
        "output_shape": list(aug.out_shape) if aug.out_shape else None,
        "output_dtype": aug.out_dtype,
        "remote": remote.to_dict() if remote is not None else None,
    }


def _settings(f: Findings) -> dict[str, Any]:
    s = f.settings
    return {
        "batch_size": s.batch_size,
        "transforms": s.transforms_label,
        "workers_max": s.workers_max,
        "workers": s.workers,
        "cores": s.cores,
        "seconds": s.seconds,
        "sample_size": s.sample_size,
        "cache": s.cache,
    }


def _pipeline(f: Findings) -> dict[str, Any]:
    cost, storage = f.cost, f.storage
    note = storage.cache_note
    if f.loader.reads_warm:
        note += (
            "; the loader runs read from the page cache, so their rates are above the "
            "cold-cache predictions"
        )
    return {
        **cost.to_dict(),
        "other_threads": cost.others(f.settings.cores),
        "one_worker_rate": cost.one_worker_rate,
        "cache": "cold" if storage.use_cold else "warm",
        "cache_note": note,
        "read_from": storage.read.name,
        "decode_with": f.decode.main.name if f.decode.main else None,
        "augment_ops": [
            {"op": n, "ms": 1e3 * w, "cpu_ms": 1e3 * c} for n, w, c in f.augment.breakdown
        ],
    }


def _loader(f: Findings) -> dict[str, Any]:
    sweep = f.loader
    return {
        "measured": [
            {
                "workers": r.workers,
                "rate": r.rate,
                "startup_s": r.startup_s,
                "samples": r.samples,
                "seconds": r.seconds,
                "skipped": len(r.skipped),
                "load": r.load.to_dict() if r.load else None,
                "given_load": sweep.given_load.get(r.workers),
                "per_set": list(r.per_set),
            }
            for r in sweep.runs
        ],
        "predicted": [{"workers": k, "rate": v} for k, v in sorted(sweep.predicted.items())],
        "efficiency": sweep.efficiency,
        "model": MODEL,
        "assumption": assumption(f.cost, f.settings.cores),
    }


def _clean(x: Any) -> Any:
    """JSON-safe copy: infinities and NaN become None, tuples lists, numpy scalars floats."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if x is None or isinstance(x, (int, str)):  # bool is an int
        return x
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f if math.isfinite(f) else None


# -- the report -------------------------------------------------------------------------------


class Report:
    """What ``diagnose`` found. ``str(report)`` is the terminal report; ``to_dict()`` the JSON."""

    def __init__(self, data: dict[str, Any]) -> None:
        data = _clean(data)
        data.setdefault("schema", SCHEMA)
        self.data: dict[str, Any] = data

    @property
    def bound(self) -> str | None:
        """The stage that bounds the run: storage, decode, augment, loader, host-to-device, model."""
        v = self.data.get("verdict")
        return v.get("bound") if v else None

    @property
    def gpu_busy_share(self) -> float | None:
        v = self.data.get("verdict")
        return v.get("gpu_busy_share") if v else None

    @property
    def loader_measured(self) -> dict[int, float]:
        return _by_workers(self.data.get("loader", {}).get("measured", []))

    @property
    def loader_predicted(self) -> dict[int, float]:
        return _by_workers(self.data.get("loader", {}).get("predicted", []))

    @property
    def loader_basis(self) -> str | None:
        """``"measured"`` or ``"predicted"``: where the verdict's loader rate comes from."""
        v = self.data.get("verdict")
        return v.get("loader_basis", "measured") if v else None

    @property
    def corrupt(self) -> list[dict[str, Any]]:
        """The samples training would stop at: key, where, reason, found_by, kind (corrupt, or
        pipeline when the sample decoded but a transform or shape check failed)."""
        return list((self.data.get("corrupt") or {}).get("items", []))

    @property
    def recommendations(self) -> list[dict[str, Any]]:
        return list(self.data.get("recommendations", []))

    @property
    def stages(self) -> list[dict[str, Any]]:
        return list(self.data.get("stages", []))

    @property
    def checks(self) -> list[dict[str, Any]]:
        return list(self.data.get("system", []))

    @property
    def not_measured(self) -> list[dict[str, str]]:
        return list(self.data.get("not_measured", []))

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self.data))

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.data, indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Report:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("schema") not in SCHEMAS_READ:
            found = data.get("schema") if isinstance(data, dict) else None
            raise ValueError(
                f"not a stoker doctor report this version reads (schema {found!r}; "
                f"expected one of {', '.join(SCHEMAS_READ)})"
            )
        return cls(data)

    def __repr__(self) -> str:
        return f"Report(bound={self.bound!r}, gpu_busy_share={self.gpu_busy_share!r})"

    def __str__(self) -> str:
        return self.render()

    def render(self, *, width: int = 100) -> str:
        """The terminal report: one block per section, each followed by a blank line."""
        d = self.data
        out = _Lines(width)
        _header(out, d)
        _remote(out, d.get("source", {}).get("remote"))
        _corrupt(out, d.get("corrupt"))
        _stage_table(out, d.get("stages", []), d.get("pipeline") or {})
        _loader_table(out, d.get("loader") or {}, d.get("pipeline") or {}, d.get("settings", {}))
        _device(out, d.get("h2d"), d.get("model"))
        _system(out, d.get("system", []))
        _verdict(out, d.get("verdict"))
        _changes(out, d.get("recommendations", []))
        _not_measured(out, d.get("not_measured", []))
        line = budget_line(d.get("budget"))
        if line is not None:
            out.wrap(line, indent="")
        elif d.get("elapsed_s") is not None:
            out.append(f"(doctor ran for {d['elapsed_s']:.1f} s)")
        return "\n".join(out)

    def plot(self, path: str | os.PathLike[str]) -> str:
        """Write a PNG: stage rates (left) and the loader's scaling curve (right)."""
        from stoker.doctor.chart import plot

        return plot(self.data, path)

    def figure(self) -> Any:
        """The same chart as a matplotlib ``Figure`` (stage rates in ``fig.axes[0]``, the
        loader's scaling in ``fig.axes[1]``), to show or adjust before saving."""
        from stoker.doctor.chart import figure

        return figure(self.data)


def _by_workers(points: list[dict[str, Any]]) -> dict[int, float]:
    return {int(p["workers"]): p["rate"] for p in points}


# -- text -------------------------------------------------------------------------------------


def _num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:,.{digits}f}"


def _size(n: float | None) -> str:
    return "-" if n is None else size_text(n)


class _Lines(list[str]):
    """The report's lines, with word wrapping at the report's width."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width

    def wrap(self, text: str, indent: str = "  ") -> None:
        self.extend(
            textwrap.wrap(
                text,
                width=self.width,
                initial_indent=indent,
                subsequent_indent=indent + "  ",
                break_on_hyphens=False,  # an option such as --step-time stays whole
            )
        )


def _header(out: _Lines, d: dict[str, Any]) -> None:
    src, st = d.get("source", {}), d.get("settings", {})
    unit = "images" if src.get("kind") == "folder" else "records"
    out.append(
        f"stoker doctor: {src.get('path')} ({src.get('kind')}, {_num(src.get('count'))} {unit}, "
        + ("about " if src.get("kind") == "folder" else "")
        + f"{_num((src.get('total_bytes') or 0) / 1e6, 1)} MB"
        + (f", typical image {src['image_shape']}" if src.get("image_shape") else "")
        + ")"
    )
    out.append(
        f"batch {st.get('batch_size')}, transforms {st.get('transforms')}, workers 1..{st.get('workers_max')}, "
        f"{st.get('cores')} usable core(s); a budget of {st.get('seconds')} s"
    )
    pipe = d.get("pipeline") or {}
    if pipe.get("cache_note"):
        out.wrap(f"cache: {pipe['cache_note']}", indent="")
    out.append("")


def _remote(out: _Lines, r: dict[str, Any] | None) -> None:
    """A set in object storage: the download figures, the shard cache and its verdict."""
    if not r:
        return
    out.append("Storage (object storage, through the shard cache)")
    if r.get("mb_per_s") is not None:
        out.wrap(
            f"download: {_num(r['mb_per_s'], 1)} MB/s (shard {r['shard']}, "
            f"{_size(r['shard_bytes'])} in {_num(r['download_s'], 3)} s, uncached); time to "
            f"first byte {_num(r.get('ttfb_ms'), 1)} ms; about {_num(r.get('samples_per_s'))} "
            "records/s"
        )
    else:
        out.wrap(f"download: not measured ({r.get('skipped') or 'no figure'})")
    out.wrap(
        f"cache: {r['cache_dir']}: budget {_size(r['cache_limit'])}, in use "
        f"{_size(r['cache_used'])}, free on its disk {_size(r['cache_free'])}; the set: "
        f"{_size(r['set_bytes'])} in {r['shards']} shard(s), largest "
        f"{_size(r['largest_shard_bytes'])}; shuffle="
        + ("True" if r["shuffle"] == "true" else repr(r["shuffle"]))
    )
    out.wrap(r["text"][0].upper() + r["text"][1:] + ".")
    out.append("")


def _stage_table(out: _Lines, stages: list[dict[str, Any]], pipe: dict[str, Any]) -> None:
    out.append("Stages, one process each (samples/s)")
    out.append(
        f"  {'stage':<16}{'measurement':<34}{'samples/s':>11}{'ms/sample':>11}{'CPU':>6}{'MB/s':>9}"
    )
    order = {"storage": 0, "decode": 1, "augment": 2, "loader": 3}
    for s in sorted(stages, key=lambda s: order.get(s["stage"], 3)):
        cpu = ""
        if s.get("per_sample_ms"):
            cpu = f"{100 * (s.get('cpu_per_sample_ms') or 0) / s['per_sample_ms']:.0f}%"
        out.append(
            f"  {s['stage']:<16}{s['name'][:33]:<34}{_num(s.get('rate')):>11}"
            f"{_num(s.get('per_sample_ms'), 3):>11}{cpu:>6}{_num(s.get('mb_per_s'), 1) if s.get('mb_per_s') else '':>9}"
        )
    if pipe.get("total_ms") is not None:
        out.append(
            f"  one worker, per sample: read {_num(pipe.get('read_ms'), 3)} + decode {_num(pipe.get('decode_ms'), 3)}"
            f" + augment {_num(pipe.get('augment_ms'), 3)} + assemble {_num(pipe.get('assemble_ms'), 3)}"
            f" = {_num(pipe.get('total_ms'), 3)} ms"
            f" ({100 * (pipe.get('cpu_share') or 0):.0f} % CPU) -> {_num(pipe.get('one_worker_rate'))} samples/s"
        )
    ops = pipe.get("augment_ops") or []
    if ops:
        out.append(
            "  augmentation ops (ms/sample): " + ", ".join(f"{o['op']} {o['ms']:.3f}" for o in ops)
        )
    out.append("")


def _loader_table(
    out: _Lines, ld: dict[str, Any], pipe: dict[str, Any], st: dict[str, Any]
) -> None:
    meas = {int(p["workers"]): p for p in ld.get("measured", [])}
    pred = {int(p["workers"]): p for p in ld.get("predicted", [])}
    if not (meas or pred):
        return
    loads = any(p.get("load") for p in meas.values())
    out.append(
        "Loader (stoker.Loader), samples/s: measured runs, and the model's predictions"
        + ("" if meas else " (no run was measured)")
    )
    head = f"  {'workers':>7}{'measured':>11}{'predicted':>11}{'start-up s':>12}"
    if loads:
        head += f"{'cores taken by others':>23}{'predicted given load':>22}"
    out.append(head)
    for k in sorted(set(meas) | set(pred)):
        m = meas.get(k, {})
        row = (
            f"  {k:>7}{_num(m.get('rate')):>11}{_num(pred.get(k, {}).get('rate')):>11}"
            f"{_num(m.get('startup_s'), 2) if m else '':>12}"
        )
        load = m.get("load")
        if loads and load:
            taken = f"{load['others_cores']:.1f} of {load['cores']}"
            row += f"{taken:>23}{_num(m.get('given_load')):>22}"
        out.append(row)
    best: dict[str, Any] = max(meas.values(), key=lambda p: p.get("rate") or 0, default={})
    if best.get("per_set"):  # a mixture: each set's share of the samples, at the best rate
        n, rate = sum(best["per_set"]), best["rate"] or 0
        each = [f"set {s} {c / n:.0%}, {_num(rate * c / n)}" for s, c in enumerate(best["per_set"])]
        out.wrap(f"Per set at {best['workers']} workers (share, samples/s): {'; '.join(each)}.")
    if ld.get("efficiency") is not None:
        out.wrap(
            "predicted(k) = min(e k / (b + c / s_k), s_k / m), s_k = min(1, C / (L + k)): "
            f"per sample b = {_num(pipe.get('blocked_ms'), 3)} ms blocked, "
            f"c = {_num(pipe.get('cpu_ms'), 3)} ms CPU in a worker, "
            f"m = {_num(pipe.get('main_cpu_ms'), 3)} ms CPU in the training process; "
            f"C = {st.get('cores')} cores, L = {_num(pipe.get('other_threads'), 1)} other "
            f"runnable threads, e = {ld['efficiency']:.2f} (see stoker.doctor.verdict)",
        )
    if ld.get("assumption"):
        out.wrap(f"The predictions assume {ld['assumption']}.")
    if loads:
        out.wrap(
            "Cores taken by others: CPU time other processes (and steal) used on the usable "
            "cores during each measured run; predicted given load: the model with the cores "
            "they left free."
        )
    out.append("")


def _corrupt(out: _Lines, c: dict[str, Any] | None) -> None:
    if not c or not c.get("text"):
        return
    out.append("Corrupt data" if not c.get("failed") else "Samples training would stop at")
    out.wrap(c["text"])
    out.append("")


def _device(out: _Lines, h2d: dict[str, Any] | None, model: dict[str, Any] | None) -> None:
    if h2d:
        out.append(
            f"Host-to-device copy: {_num(h2d.get('rate'))} samples/s ({_num(h2d.get('gb_per_s'), 2)} GB/s, "
            f"{h2d.get('dtype')} batches, {'pinned' if h2d.get('pinned') else 'pageable'})"
        )
    if model:
        out.append(
            f"Model: {_num(model.get('rate'))} samples/s (step {_num(model.get('step_ms'), 1)} ms for a batch of "
            f"{model.get('batch_size')}, {model.get('source')})"
        )
    if h2d or model:
        out.append("")


def _listing(out: _Lines, title: str, lines: list[str]) -> None:
    """A section of one wrapped line per item, under ``title``; nothing when there are none."""
    if not lines:
        return
    out.append(title)
    for line in lines:
        out.wrap(line)
    out.append("")


def _system(out: _Lines, checks: list[dict[str, Any]]) -> None:
    lines = [f"{c['status'].upper():<5} {c['name']}: {c['message']}" for c in checks]
    _listing(out, "System", lines)


def _verdict(out: _Lines, v: dict[str, Any] | None) -> None:
    if not v:
        return
    out.append(
        f"Verdict: {headline(v)}"
        + (
            f"; expected GPU busy share {100 * v['gpu_busy_share']:.0f} %"
            if v.get("gpu_busy_share") is not None
            else ""
        )
        + (" (predicted)" if v.get("loader_basis") == "predicted" else "")
    )
    out.wrap(v["text"])
    out.append("")


def _changes(out: _Lines, recs: list[dict[str, Any]]) -> None:
    if not recs:
        return
    out.append("Changes, best first")
    for i, r in enumerate(recs, 1):
        out.wrap(
            f"{i}. {r['action']}: loader {_num(r['loader_before'])} -> {_num(r['loader_after'])} samples/s "
            f"(x{r['loader_gain']:.2f}); run x{r['gain']:.2f} [{r['basis']}; "
            + ("a trade: changes what the model sees]" if r.get("changes_data") else "same data]")
        )
        out.wrap(r["detail"], indent="     ")
    out.append("")


def _not_measured(out: _Lines, nm: list[dict[str, str]]) -> None:
    _listing(out, "Not measured", [f"{x['stage']}: {x['reason']}" for x in nm])
