"""The figures plugin (docs/reliability.md, faults.md section C), loaded by tests/conftest.py.

Tests anywhere record what they tried with the session-scoped ``figures`` fixture::

    figures.add("F-01", tried=1, ok=1, note="B3")

and ``pytest_terminal_summary`` prints one table, ``figure | tried | ok | target | met``, at the
end of any run that recorded a figure (``make test`` for the bounded samples, ``make test-slow``
for the full ones). With ``STOKER_FIGURES_JSON=path`` the same rows are also written as JSON.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest


def _all(tried: int, ok: int) -> bool:
    return tried > 0 and ok == tried


#: figure -> (target in words, met(tried, ok)); "ok" means handled / clean / detected / killed.
TARGETS: dict[str, tuple[str, Callable[[int, int], bool]]] = {
    "F-01": ("100% handled, >= 300 cases", lambda t, o: t >= 300 and o == t),
    "F-02": ("0 crash/hang/alloc/other", _all),
    "F-03 verify: header bits": ("100% detected", _all),
    "F-03 verify: payload bits": ("100% detected", _all),
    "F-03 loader: header bits": ("100% detected", _all),
    "F-03 loader: payload bits": ("100% detected", _all),
    "F-05": ("0 left after every kill cycle", _all),
    "F-09": ("0 invalid, 100% verify (slow: 28)", _all),
    "F-13": ("100% mutants killed, >= 5", lambda t, o: t >= 5 and o == t),
    "F-14 recordio": ("0 crash/hang/bad (slow: 40)", _all),
    "F-14 tfrecord": ("0 crash/hang/bad (slow: 40)", _all),
    "F-14 wds": ("0 crash/hang/bad (slow: 40)", _all),
    "F-14 lmdb": ("0 crash/hang/bad (slow: 200)", _all),
}


@dataclass
class _Row:
    tried: int = 0
    ok: int = 0
    notes: list[str] = field(default_factory=list)


class Figures:
    """Counts per figure; thread-safe; one per session."""

    def __init__(self) -> None:
        self.rows: dict[str, _Row] = {}
        self._lock = threading.Lock()

    def add(self, figure: str, *, tried: int, ok: int, note: str = "") -> None:
        if not 0 <= ok <= tried:
            raise ValueError(f"{figure}: ok={ok} must lie in 0..tried={tried}")
        with self._lock:
            row = self.rows.setdefault(figure, _Row())
            row.tried += tried
            row.ok += ok
            if note and note not in row.notes:
                row.notes.append(note)

    def table(self) -> list[dict]:
        out = []
        for name in sorted(self.rows):
            row = self.rows[name]
            target, met = TARGETS.get(name, ("100%", _all))
            out.append(
                {
                    "figure": name,
                    "tried": row.tried,
                    "ok": row.ok,
                    "target": target,
                    "met": bool(met(row.tried, row.ok)),
                    "notes": row.notes,
                }
            )
        return out


_FIGURES = Figures()


@pytest.fixture(scope="session")
def figures() -> Figures:
    return _FIGURES


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    rows = _FIGURES.table()
    if not rows:
        return
    tr = terminalreporter
    tr.section("stoker reliability figures (docs/reliability.md)")
    w = max(len(r["figure"]) for r in rows)
    tr.write_line(f"{'figure':<{w}} | {'tried':>6} | {'ok':>6} | {'target':<34} | met")
    tr.write_line("-" * (w + 62))
    for r in rows:
        tr.write_line(
            f"{r['figure']:<{w}} | {r['tried']:>6} | {r['ok']:>6} | {r['target']:<34} | "
            f"{'yes' if r['met'] else 'NO'}"
        )
        for note in r["notes"]:
            tr.write_line(f"{'':<{w}}   {note}")
    out = os.environ.get("STOKER_FIGURES_JSON")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)
