"""The run's budget: how long it had (``seconds``), how long it took, and whether every
measurement's interval came out tight or the budget ran out first (the report's ``budget``)."""

from __future__ import annotations

from typing import Any

from stoker.doctor.findings import CUT, Findings
from stoker.doctor.measure.timing import TIGHT

__all__ = ["budget_data", "budget_line"]


def _width(lo: float, hi: float, mid: float) -> float:
    """The interval's half-width as a share of the figure."""
    return (hi - lo) / (2 * mid) if mid > 0 else 0.0


def budget_data(f: Findings, elapsed_s: float, startup_s: float = 0.0) -> dict[str, Any]:
    """``{seconds, spent_s (after start-up), startup_s, tight (the target half-width), ended:
    "tight" | "budget", loose: [{name, ms, lo_ms, hi_ms, width}], cut: [stage]}``: ``loose``
    lists each measurement whose interval is wider than the target (a cold pass reads each
    sample once and is not counted), ``cut`` those the budget left no time for."""
    loose = []
    for st in f.stages:
        if st.spread is None or st.tight or "(cold)" in st.name:
            continue
        lo, hi = st.interval_s
        mid = st.per_sample_s
        loose.append(_row(st.name, mid, lo, hi))
    for r in f.loader.runs if hasattr(f, "loader") else []:
        sp = r.spread
        if sp is None or sp.tight:
            continue
        loose.append(_row(f"the loader at {r.workers} worker(s)", sp.mid_s, sp.lo_s, sp.hi_s))
    cut = [x["stage"] for x in f.not_measured if x["reason"].startswith(CUT)]
    return {
        "seconds": f.settings.seconds,
        "spent_s": elapsed_s - startup_s,
        "startup_s": startup_s,
        "tight": TIGHT,
        "ended": "budget" if loose or cut else "tight",
        "loose": loose,
        "cut": cut,
    }


def _row(name: str, mid: float, lo: float, hi: float) -> dict[str, Any]:
    return {
        "name": name,
        "ms": 1e3 * mid,
        "lo_ms": 1e3 * lo,
        "hi_ms": 1e3 * hi,
        "width": _width(lo, hi, mid),
    }


def budget_line(b: dict[str, Any] | None) -> str | None:
    """The report's line on the budget, or ``None`` (a report without one)."""
    if not b:
        return None
    head = f"Budget {b['seconds']:g} s, spent {b['spent_s']:.2f} s"
    head += f" after {b['startup_s']:.1f} s of start-up: " if b.get("startup_s") else ": "
    cut = f"; it cut {', '.join(b['cut'])}" if b.get("cut") else ""
    target = f"±{100 * b['tight']:.0f} %"
    if b["ended"] == "tight":
        return head + f"every measurement's interval came out tight (within {target})."
    if not b["loose"]:
        return head + f"the budget ran out{cut}; a larger --seconds gives them time."
    worst = sorted(b["loose"], key=lambda x: -x["width"])[:3]
    named = ", ".join(f"{x['name']} ±{100 * x['width']:.0f} %" for x in worst)
    return (
        head + f"the budget ran out before {len(b['loose'])} interval(s) were within {target}"
        f" ({named}){cut}; the verdict weighs their intervals, and a larger --seconds narrows them."
    )
