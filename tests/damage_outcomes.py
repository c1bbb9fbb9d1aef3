"""Runs one (possibly damaged) set through ``_outcome_child.py`` in a child process, for the
damage runs that count outcomes (F-14: ``tests/reliability/test_f14_outcomes.py`` and the
LMDB run in ``tests/formats/test_lmdb_pages_fuzz.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_outcome_child.py")


def run_child(path: str, workers: int, limit: float) -> list[dict]:
    """The child's lines (``verify``, ``inspect``, ``loader``), then
    ``{"tool": "process", "outcome": "crash"|"hang"|"bad"}`` if it did not end by itself
    within ``limit`` seconds."""
    cmd = [sys.executable, CHILD, path, str(workers)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return [*map(json.loads, out.splitlines()), {"tool": "process", "outcome": "hang"}]
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    if r.returncode != 0:
        what = "crash" if r.returncode < 0 else "bad"
        lines.append({"tool": "process", "outcome": what, "detail": r.stderr[-300:]})
    return lines
