"""The doctor's chart: a PNG of the stage rates (left) and the loader's scaling curve (right),
drawn from a report's data.

Measured and predicted figures look different: measured loader rates are points, the model's
prediction a dashed line labelled as one, and the prediction for the cores other processes
left free during each run a cross; below the curve, what the prediction assumes of the
machine's load and what other processes took during the runs. A loader rate that was not
measured is drawn hatched and labelled "predicted".
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

__all__ = ["figure", "plot", "require_matplotlib"]

#: what to install for the chart
INSTALL = 'pip install "stoker[plot]"'


def require_matplotlib() -> None:
    """Raise ``ImportError`` naming the install when matplotlib cannot be imported (checked
    before a run, so that a long measurement does not end in this error)."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError as e:
        raise ImportError(f"--plot needs matplotlib: {INSTALL}") from e


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
    from stoker._core.atomic import atomic_write

    fig = figure(d)
    out = os.fspath(path)
    with atomic_write(out, "wb") as f:
        fig.savefig(f, format="png", dpi=110)
    return out


def figure(d: dict[str, Any]) -> Any:
    """The chart of report data ``d`` as a matplotlib ``Figure``: stage rates on the left, the
    loader's scaling on the right (``fig.axes[1]``)."""
    require_matplotlib()
    from matplotlib.figure import Figure  # a bare Figure renders with Agg, pyplot untouched

    fig = Figure(figsize=(12, 5.4))
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1]})
    ld = d.get("loader") or {}
    meas = _curve(ld.get("measured", []))
    pred = _curve(ld.get("predicted", []))
    _stage_bars(ax1, d, meas)
    _scaling(ax2, d, meas, pred)
    fig.suptitle(_title(d))
    fig.tight_layout()
    return fig


def _curve(points: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return sorted((int(p["workers"]), p["rate"]) for p in points if p.get("rate"))


def _bar_rows(d: dict[str, Any], meas: list[tuple[int, float]]) -> list[dict[str, Any]]:
    """One bar per measured stage, the loader at its best count (the verdict's predicted
    figure, marked, when no run was measured), the copy and the model."""
    rows = [s for s in d.get("stages", []) if s.get("rate")]
    v = d.get("verdict") or {}
    if meas:
        k, r = max(meas, key=lambda x: x[1])
        rows.append({"name": f"stoker.Loader, {k} worker(s)", "stage": "loader", "rate": r})
    elif v.get("loader_rate"):
        rows.append(
            {
                "name": f"stoker.Loader, {v.get('workers')} worker(s) (predicted)",
                "stage": "loader",
                "rate": v["loader_rate"],
                "predicted": True,
            }
        )
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
        bars = ax.barh(names, rates, color=[COLORS.get(r["stage"], "#999999") for r in rows][::-1])
        for bar, r in zip(bars, rows[::-1]):
            if r.get("predicted"):
                bar.set_hatch("//")
                bar.set_alpha(0.5)
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


def _points(ax: Any, points: list[tuple[int, float]], style: str, **kw: Any) -> None:
    """``points`` (workers, samples/s) in the loader's colour."""
    ax.plot([p[0] for p in points], [p[1] for p in points], style, color=COLORS["loader"], **kw)


def _scaling(
    ax: Any,
    d: dict[str, Any],
    meas: list[tuple[int, float]],
    pred: list[tuple[int, float]],
) -> None:
    if pred:
        _points(ax, pred, "--", alpha=0.7, label="predicted (model)")
    ld = d.get("loader") or {}
    given = sorted(
        (int(p["workers"]), p["given_load"]) for p in ld.get("measured", []) if p.get("given_load")
    )
    if given:
        _points(ax, given, "x", markersize=8, label="predicted for the cores left free in each run")
    if meas:
        _points(ax, meas, "o", markersize=7, linestyle="none", label="measured")
    else:
        ax.text(
            0.5,
            0.5,
            "no loader run measured:\nthe line is a prediction",
            transform=ax.transAxes,
            ha="center",
            fontsize=9,
            color="#555555",
        )
    model = d.get("model")
    if model and model.get("rate"):
        ax.axhline(model["rate"], color=COLORS["model"], linestyle=":", label="model consumes")
    h2d = d.get("h2d")
    if h2d and h2d.get("rate"):
        ax.axhline(
            h2d["rate"], color=COLORS["host-to-device"], linestyle=":", label="host-to-device"
        )
    ax.set_xlabel("\n".join(["workers", *_load_note(ld)]), fontsize=9)
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Loader scaling")
    if pred or meas:
        ax.legend(fontsize=7)
        ax.set_xticks(sorted({p[0] for p in pred} | {p[0] for p in meas}))


def _load_note(ld: dict[str, Any]) -> list[str]:
    """Lines under the scaling curve: the prediction's assumption and, per measured run, the
    cores other processes took."""
    text = ""
    if ld.get("assumption"):
        text = f"Predictions assume {ld['assumption']}."
    taken = [
        f"{p['load']['others_cores']:.1f} with {p['workers']} worker(s)"
        for p in ld.get("measured", [])
        if p.get("load")
    ]
    if taken:
        cores = next(p["load"]["cores"] for p in ld["measured"] if p.get("load"))
        text += f" Other processes took, of the {cores} usable core(s): {', '.join(taken)}."
    return textwrap.wrap(text, width=62, break_on_hyphens=False)


def _title(d: dict[str, Any]) -> str:
    v = d.get("verdict")
    name = os.path.basename(str(d.get("source", {}).get("path", "")).rstrip("/"))
    title = f"stoker doctor: {name}"
    if v:
        from stoker.doctor.verdict import headline

        title += f" - {headline(v)}"
        if v.get("gpu_busy_share") is not None:
            title += f", GPU busy {100 * v['gpu_busy_share']:.0f} %"
        if v.get("loader_basis") == "predicted":
            title += " (predicted)"
    bad = (d.get("corrupt") or {}).get("count")
    if bad:
        unit = (d.get("corrupt") or {}).get("unit", "file")
        title += f"; {bad} corrupt {unit}{'s' if bad != 1 else ''}"
    return title
