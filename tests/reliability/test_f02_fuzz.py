"""F-02: seeded random mutations of a small valid record set (faults.md row 38).

Every mutation must give the right payload (checksums on) or a ``StokerFormatError``; never
another exception, a crash, a hang (2 s of CPU per case) or an unbounded allocation (peak RSS
growth over 64 MB). The cases run in a child process (``_fuzz_child.py``) under a wall-clock
timeout, so a crash or a blocked read fails this test instead of the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SEED = 20261201
CHILD = Path(__file__).with_name("_fuzz_child.py")


def _fuzz(tmp_path: Path, first: int, count: int, figures, timeout: float) -> None:
    try:
        proc = subprocess.run(
            [sys.executable, str(CHILD), str(SEED), str(first), str(count), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        at = (tmp_path / "progress").read_text().strip()
        figures.add("F-02", tried=count, ok=0, note=f"seed {SEED}: blocked at case {at}")
        pytest.fail(f"fuzz child blocked (wall-clock timeout) at case {at}")
    if proc.returncode != 0:
        at = (tmp_path / "progress").read_text().strip()
        figures.add("F-02", tried=count, ok=0, note=f"seed {SEED}: crash at case {at}")
        pytest.fail(f"fuzz child died (rc {proc.returncode}) at case {at}: {proc.stderr[-800:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    counts = out["counts"]
    clean = counts.get("ok", 0) + counts.get("format-error", 0)
    c = counts
    figures.add(
        "F-02",
        tried=out["cases"],
        ok=clean,
        note=f"seed {SEED}, cases {first}..{first + count - 1}: crash/hang/alloc = 0/"
        f"{c.get('hang', 0)}/{c.get('alloc', 0)}, other exceptions {c.get('other', 0)}, "
        f"wrong payloads {c.get('wrong', 0)}",
    )
    assert clean == out["cases"], f"{counts}; first findings: {out['bad']}"


def test_fuzz_sample(tmp_path, figures):
    _fuzz(tmp_path, 0, 300, figures, timeout=300)


@pytest.mark.slow
def test_fuzz_full(tmp_path, figures):
    _fuzz(tmp_path, 300, 5000, figures, timeout=1200)
