"""Every benchmark takes ``--quick`` (``make bench BENCH_ARGS=--quick`` hands it to each), read
by its own argument parser, without running a benchmark: each ``bench/bench_*.py`` is imported
in one child process (a bench sets thread variables and imports OpenCV at import time) and its
``parse_args(["--quick"])`` must set ``quick`` (bench_revisions, which `make bench` runs only
when asked, also needs the revision to compare against: ``--old``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"

CHILD = """
import importlib, json, sys
sys.path.insert(0, sys.argv[1])
out = {}
for name in sys.argv[2:]:
    module = importlib.import_module(name)
    argv = ["--quick"] + (["--old", "HEAD"] if name == "bench_revisions" else [])
    try:
        out[name] = bool(module.parse_args(argv).quick)
    except SystemExit as e:  # argparse refused the flag
        out[name] = f"exit {e.code}"
    except AttributeError as e:
        out[name] = f"no parse_args: {e}"
print(json.dumps(out))
"""


def test_every_bench_takes_quick():
    names = sorted(p.stem for p in BENCH.glob("bench_*.py"))
    assert len(names) >= 13, names
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(BENCH), *names],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {name: True for name in names}, got
