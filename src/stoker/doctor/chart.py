"""The doctor's chart: a PNG of the stage rates (left) and the loader's scaling curve (right),
drawn from a report's data."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["plot"]

COLORS = {
    "storage": "#4c72b0",
    "decode": "#dd8452",
    "augment": "#55a868",
    "loader": "#8172b3",
    "host-to-device": "#c44e52",
    "model": "#937860",
}


def plot(d: dict[str, Any], path: str | os.PathLike[str]) -> str:
    """Write the chart of report data ``d`` to ``path`` (atomically); returns the path."""
    try:  # a bare Figure renders with Agg and leaves pyplot's backend alone
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install 'stoker[plot]'") from e
    from stoker._core.atomic import atomic_write

    fig = Figure(figsize=(12, 4.8))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1]})
    ld = d.get("loader") or {}
    meas = _curve(ld.get("measured", []))
    pred = _curve(ld.get("predicted", []))
    _stage_bars(ax1, d, meas)
    _scaling(ax2, d, meas, pred)
    fig.suptitle(_title(d))
    fig.tight_layout()
    out = os.fspath(path)
    with atomic_write(out, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    return out


def _curve(points: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return sorted((int(p["workers"]), p["rate"]) for p in points if p.get("rate"))


def _bar_rows(d: dict[str, Any], meas: list[tuple[int, float]]) -> list[dict[str, Any]]:
    """One bar per measured stage, the loader at its best count, the copy and the model."""
    rows = [s for s in d.get("stages", []) if s.get("rate")]
    if meas:
        k, r = max(meas, key=lambda x: x[1])
        rows.append({"name": f"stoker.Loader, {k} worker(s)", "stage": "loader", "rate": r})
    for key, name, stage in (
        ("h2d", "host-to-device copy", "host-to-device"),
        ("model", "model consumption", "model"),
    ):
        x = d.get(key)
        if x and x.get("rate"):
            rows.append({"name": name, "stage": stage, "rate": x["rate"]})
    return rows


def _stage_bars(ax: Any, d: dict[str, Any], meas: list[tuple[int, float]]) -> None:
    rows = _bar_rows(d, meas)
    if rows:
        names = [r["name"] for r in rows][::-1]
        rates = [r["rate"] for r in rows][::-1]
        ax.barh(names, rates, color=[COLORS.get(r["stage"], "#999999") for r in rows][::-1])
        ax.set_xscale("log")
        for y, rate in enumerate(rates):
            ax.text(rate, y, f" {rate:,.0f}", va="center", fontsize=8)
        ax.set_xlim(right=max(rates) * 6)
    model = d.get("model")
    if model and model.get("rate"):
        ax.axvline(model["rate"], color=COLORS["model"], linestyle="--", linewidth=1)
    ax.set_xlabel("samples/s (log scale; one process per stage)")
    ax.set_title("Stage rates")
    ax.tick_params(axis="y", labelsize=8)


def _scaling(
    ax: Any,
    d: dict[str, Any],
    meas: list[tuple[int, float]],
    pred: list[tuple[int, float]],
) -> None:
    for curve, style, label in ((pred, "--", "predicted"), (meas, "o-", "measured")):
        if curve:
            xs, ys = [p[0] for p in curve], [p[1] for p in curve]
            ax.plot(xs, ys, style, color=COLORS["loader"], label=label)
    model = d.get("model")
    if model and model.get("rate"):
        ax.axhline(model["rate"], color=COLORS["model"], linestyle=":", label="model consumes")
    h2d = d.get("h2d")
    if h2d and h2d.get("rate"):
        ax.axhline(
            h2d["rate"], color=COLORS["host-to-device"], linestyle=":", label="host-to-device"
        )
    ax.set_xlabel("workers")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Loader scaling")
    if pred or meas:
        ax.legend(fontsize=8)
        ax.set_xticks(sorted({p[0] for p in pred} | {p[0] for p in meas}))


def _title(d: dict[str, Any]) -> str:
    v = d.get("verdict")
    name = os.path.basename(str(d.get("source", {}).get("path", "")).rstrip("/"))
    title = f"stoker doctor: {name}"
    if v:
        title += f" - {v['bound']} bounds the run"
        if v.get("gpu_busy_share") is not None:
            title += f", GPU busy {100 * v['gpu_busy_share']:.0f} %"
    return title
