"""Nothing is dropped to keep the default run quick: the default and interop collections
together hold at least the default collection recorded when this wave began."""

from __future__ import annotations

import subprocess
import sys

import pytest

from run_gates import COUNTS, start_record, whole_tree_collected


def _counts(config: pytest.Config) -> dict:
    """This run's counts when it collected the whole tree, else a collection of its own."""
    if whole_tree_collected(config):
        return config.stash[COUNTS]
    root = str(config.rootpath)
    got = {}
    for name, expr in (
        ("default", "not slow and not interop"),
        ("interop", "interop and not slow"),
    ):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "--collect-only",
                "-q",
                "-p",
                "no:cacheprovider",
                "-m",
                expr,
            ],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        ).stdout
        last = [line for line in out.splitlines() if "collected" in line][-1]
        got[name] = int(last.split("/")[0].split()[0])
    return got


def test_default_and_interop_hold_the_starting_collection(pytestconfig):
    counts = _counts(pytestconfig)
    start = start_record()
    together = counts["default"] + counts["interop"]
    print(
        f"default {counts['default']} + interop {counts['interop']} = {together}; "
        f"default at {start['commit']}: {start['default']}"
    )
    assert together >= start["default"], (
        f"default + interop collect {together} tests, fewer than the {start['default']} the "
        f"default run collected at {start['commit']}: a test was dropped, not moved"
    )
