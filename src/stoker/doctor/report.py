"""The doctor's report: one JSON-safe dict, rendered as text, JSON or a chart.

JSON schema ``stoker.doctor/1`` (top-level keys): ``schema``, ``stoker_version``, ``source``,
``settings``, ``system`` (list of checks: name, status ok|warn|fail, message, data),
``stages`` (list: name, stage, rate, per_sample_ms, cpu_per_sample_ms, mb_per_s, samples,
seconds, note), ``pipeline`` (per-sample ms by stage, cache assumption, efficiency),
``loader`` (measured and predicted: lists of {workers, rate}), ``h2d``, ``model`` (each a dict
or null), ``verdict`` (bound, workers, loader_rate, h2d_rate, model_rate, delivered,
gpu_busy_share, cpu_capped, shares, text), ``recommendations`` (action, detail, basis,
loader_before/after, delivered_before/after, gain, loader_gain), ``not_measured`` (stage,
reason), ``elapsed_s``. Rates are samples per second.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
from typing import Any

__all__ = ["SCHEMA", "Report"]

SCHEMA = "stoker.doctor/1"


def _num(x: float | None, digits: int = 0) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:,.{digits}f}"


def _clean(x: Any) -> Any:
    """JSON-safe copy: infinities and NaN become None, tuples lists, numpy scalars floats."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return x
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    return f if math.isfinite(f) else None


class Report:
    """What ``diagnose`` found. ``str(report)`` is the terminal report; ``to_dict()`` the JSON."""

    def __init__(self, data: dict[str, Any]) -> None:
        data = _clean(data)
        data.setdefault("schema", SCHEMA)
        self.data: dict[str, Any] = data

    # -- figures for programs -----------------------------------------------------------------
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
        return {
            int(p["workers"]): p["rate"] for p in self.data.get("loader", {}).get("measured", [])
        }

    @property
    def loader_predicted(self) -> dict[int, float]:
        return {
            int(p["workers"]): p["rate"] for p in self.data.get("loader", {}).get("predicted", [])
        }

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
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"not a stoker doctor report (schema {SCHEMA!r} expected)")
        return cls(data)

    def __repr__(self) -> str:
        return f"Report(bound={self.bound!r}, gpu_busy_share={self.gpu_busy_share!r})"

    def __str__(self) -> str:
        return self.render()

    # -- text ---------------------------------------------------------------------------------
    def render(self, *, width: int = 100) -> str:
        d = self.data
        out: list[str] = []
        src = d.get("source", {})
        st = d.get("settings", {})

        def wrap(text: str, indent: str = "  ") -> None:
            out.extend(
                textwrap.wrap(
                    text, width=width, initial_indent=indent, subsequent_indent=indent + "  "
                )
            )

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
            f"{st.get('cores')} usable core(s); {st.get('seconds')} s per measurement"
        )
        pipe = d.get("pipeline") or {}
        if pipe.get("cache_note"):
            wrap(f"cache: {pipe['cache_note']}", indent="")
        out.append("")
        out.append("Stages, one process each (samples/s)")
        out.append(
            f"  {'stage':<16}{'measurement':<34}{'samples/s':>11}{'ms/sample':>11}{'CPU':>6}{'MB/s':>9}"
        )
        order = {"storage": 0, "decode": 1, "augment": 2, "loader": 3}
        for s in sorted(d.get("stages", []), key=lambda s: order.get(s["stage"], 3)):
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
                "  augmentation ops (ms/sample): "
                + ", ".join(f"{o['op']} {o['ms']:.3f}" for o in ops)
            )
        out.append("")
        ld = d.get("loader") or {}
        meas = {int(p["workers"]): p for p in ld.get("measured", [])}
        pred = {int(p["workers"]): p for p in ld.get("predicted", [])}
        if meas or pred:
            out.append("Loader (stoker.Loader), samples/s")
            out.append(f"  {'workers':>7}{'measured':>11}{'predicted':>11}{'start-up s':>12}")
            for k in sorted(set(meas) | set(pred)):
                m = meas.get(k, {})
                out.append(
                    f"  {k:>7}{_num(m.get('rate')):>11}{_num(pred.get(k, {}).get('rate')):>11}"
                    f"{_num(m.get('startup_s'), 2) if m else '':>12}"
                )
            if ld.get("efficiency") is not None:
                wrap(
                    "predicted(k) = min(e k / (b + c / s_k), s_k / m), s_k = min(1, C / (L + k)): "
                    f"per sample b = {_num(pipe.get('blocked_ms'), 3)} ms blocked, "
                    f"c = {_num(pipe.get('cpu_ms'), 3)} ms CPU in a worker, "
                    f"m = {_num(pipe.get('main_cpu_ms'), 3)} ms CPU in the training process; "
                    f"C = {st.get('cores')} cores, L = {_num(pipe.get('other_threads'), 1)} other "
                    f"runnable threads, e = {ld['efficiency']:.2f} (see stoker.doctor.verdict)",
                )
            out.append("")
        h2d = d.get("h2d")
        if h2d:
            out.append(
                f"Host-to-device copy: {_num(h2d.get('rate'))} samples/s ({_num(h2d.get('gb_per_s'), 2)} GB/s, "
                f"{h2d.get('dtype')} batches, {'pinned' if h2d.get('pinned') else 'pageable'})"
            )
        model = d.get("model")
        if model:
            out.append(
                f"Model: {_num(model.get('rate'))} samples/s (step {_num(model.get('step_ms'), 1)} ms for a batch of "
                f"{model.get('batch_size')}, {model.get('source')})"
            )
        if h2d or model:
            out.append("")
        checks = d.get("system", [])
        if checks:
            out.append("System")
            for c in checks:
                wrap(f"{c['status'].upper():<5} {c['name']}: {c['message']}")
            out.append("")
        v = d.get("verdict")
        if v:
            out.append(
                f"Verdict: {v['bound']} bounds the run"
                + (
                    f"; expected GPU busy share {100 * v['gpu_busy_share']:.0f} %"
                    if v.get("gpu_busy_share") is not None
                    else ""
                )
            )
            wrap(v["text"])
            out.append("")
        recs = d.get("recommendations", [])
        if recs:
            out.append("Changes, best first")
            for i, r in enumerate(recs, 1):
                head = (
                    f"{i}. {r['action']}: loader {_num(r['loader_before'])} -> {_num(r['loader_after'])} samples/s "
                    f"(x{r['loader_gain']:.2f}); run x{r['gain']:.2f} [{r['basis']}]"
                )
                wrap(head)
                wrap(r["detail"], indent="     ")
            out.append("")
        nm = d.get("not_measured", [])
        if nm:
            out.append("Not measured")
            for x in nm:
                wrap(f"{x['stage']}: {x['reason']}")
            out.append("")
        if d.get("elapsed_s") is not None:
            out.append(f"(doctor ran for {d['elapsed_s']:.1f} s)")
        return "\n".join(out)

    # -- chart --------------------------------------------------------------------------------
    def plot(self, path: str | os.PathLike[str]) -> str:
        """Write a PNG: stage rates (left) and the loader's scaling curve (right)."""
        try:  # a bare Figure renders with Agg and leaves pyplot's backend alone
            from matplotlib.figure import Figure
        except ImportError as e:
            raise ImportError("--plot needs matplotlib: pip install 'stoker[plot]'") from e
        from stoker._core.atomic import atomic_write

        d = self.data
        fig = Figure(figsize=(12, 4.8))
        ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1]})
        stages = [s for s in d.get("stages", []) if s.get("rate")]
        colors = {
            "storage": "#4c72b0",
            "decode": "#dd8452",
            "augment": "#55a868",
            "loader": "#8172b3",
            "host-to-device": "#c44e52",
            "model": "#937860",
        }
        rows = list(stages)
        ld = d.get("loader") or {}
        meas = sorted(
            (int(p["workers"]), p["rate"]) for p in ld.get("measured", []) if p.get("rate")
        )
        if meas:
            k, r = max(meas, key=lambda x: x[1])
            rows.append({"name": f"stoker.Loader, {k} worker(s)", "stage": "loader", "rate": r})
        for key in ("h2d", "model"):
            x = d.get(key)
            if x and x.get("rate"):
                rows.append(
                    {
                        "name": "host-to-device copy" if key == "h2d" else "model consumption",
                        "stage": "host-to-device" if key == "h2d" else "model",
                        "rate": x["rate"],
                    }
                )
        if rows:
            names = [r["name"] for r in rows][::-1]
            rates = [r["rate"] for r in rows][::-1]
            ax1.barh(names, rates, color=[colors.get(r["stage"], "#999999") for r in rows][::-1])
            ax1.set_xscale("log")
            for y, rate in enumerate(rates):
                ax1.text(rate, y, f" {rate:,.0f}", va="center", fontsize=8)
            ax1.set_xlim(right=max(rates) * 6)
        model = d.get("model")
        if model and model.get("rate"):
            ax1.axvline(model["rate"], color="#937860", linestyle="--", linewidth=1)
        ax1.set_xlabel("samples/s (log scale; one process per stage)")
        ax1.set_title("Stage rates")
        ax1.tick_params(axis="y", labelsize=8)
        pred = sorted(
            (int(p["workers"]), p["rate"]) for p in ld.get("predicted", []) if p.get("rate")
        )
        if pred:
            ax2.plot(
                [p[0] for p in pred], [p[1] for p in pred], "--", color="#8172b3", label="predicted"
            )
        if meas:
            ax2.plot(
                [p[0] for p in meas], [p[1] for p in meas], "o-", color="#8172b3", label="measured"
            )
        if model and model.get("rate"):
            ax2.axhline(model["rate"], color="#937860", linestyle=":", label="model consumes")
        h2d = d.get("h2d")
        if h2d and h2d.get("rate"):
            ax2.axhline(h2d["rate"], color="#c44e52", linestyle=":", label="host-to-device")
        ax2.set_xlabel("workers")
        ax2.set_ylabel("samples/s")
        ax2.set_ylim(bottom=0)
        ax2.set_title("Loader scaling")
        if pred or meas:
            ax2.legend(fontsize=8)
            ax2.set_xticks(sorted({p[0] for p in pred} | {p[0] for p in meas}))
        v = d.get("verdict")
        title = f"stoker doctor: {os.path.basename(str(d.get('source', {}).get('path', '')).rstrip('/'))}"
        if v:
            title += f" - {v['bound']} bounds the run"
            if v.get("gpu_busy_share") is not None:
                title += f", GPU busy {100 * v['gpu_busy_share']:.0f} %"
        fig.suptitle(title)
        fig.tight_layout()
        out = os.fspath(path)
        with atomic_write(out, "wb") as f:
            fig.savefig(f, format="png", dpi=110)
        return out
