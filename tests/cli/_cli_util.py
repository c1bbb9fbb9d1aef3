"""Helpers for the CLI tests that run ``python -m stoker.cli`` in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys


def verify_json(path: str, *args: str) -> tuple[int, dict]:
    """``stoker verify PATH ARGS --json`` in a subprocess: its exit status and its report.
    A traceback on stderr fails the test: every problem belongs in the report."""
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "verify", path, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)
