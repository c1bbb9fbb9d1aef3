"""The gates on a whole test run, as a pytest plugin.

- ``--time-budget SECONDS`` (``make test`` and ``make test-interop`` pass one): the run fails
  when its wall-clock time, from the start of collection to the end of the last test, passes
  the budget. ``--durations=25`` (in ``addopts``) prints where the time went on every run.
- ``alone``: the tests that watch or change what the whole node shares (loaders' rings and the
  node's memory reservations, a killed main's leftovers and their sweep, the CPU load and
  timing the doctor measures, check-resume's kills at chosen steps) are marked ``alone`` here, by file, and
  ``make test`` runs them in a second pass of their own after a parallel pass (``-n 2``) over
  the rest. ``--budget-since`` lets both passes count from the first one's start.
- The sizes of the collections: before ``-m`` deselects anything, every collected test is
  counted as default (neither ``slow`` nor ``interop``), interop (``interop``, not ``slow``) or
  slow, and the summary prints default + interop against the default collection recorded in
  ``collection_start.json`` when this wave began (nothing is dropped to make the run quicker;
  ``tests/test_collection.py`` asserts it).
"""

from __future__ import annotations

import json
import os
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
START_RECORD = os.path.join(HERE, "collection_start.json")

#: test files that must not share the node with another test (see the module docstring)
ALONE = (
    "tests/doctor/",
    "tests/resume/",
    "tests/loader/test_node.py",
    "tests/loader/test_loader_engines.py",
    "tests/loader/test_loader_memfd.py",
    "tests/loader/test_loader_cleanup_cli.py",
    "tests/loader/test_loader_first_batch.py",
    "tests/loader/test_speed_floors.py",
    "tests/keras/test_interrupt.py",
    "tests/remote/test_remote_check_resume.py",
)

COUNTS = pytest.StashKey[dict]()
STARTED = pytest.StashKey[float]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="fail the run when its wall-clock time passes this many seconds",
    )
    parser.addoption(
        "--budget-since",
        type=float,
        default=None,
        metavar="EPOCH",
        help="count the budget from this Unix time (an earlier pass's start), not this run's",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    since = session.config.getoption("--budget-since")
    now = time.monotonic()
    session.config.stash[STARTED] = now - (time.time() - since) if since is not None else now


def category(item: pytest.Item) -> str:
    """Which run an item belongs to: ``slow`` wins over ``interop``."""
    if item.get_closest_marker("slow") is not None:
        return "slow"
    if item.get_closest_marker("interop") is not None:
        return "interop"
    return "default"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = str(config.rootpath)
    counts = {"default": 0, "interop": 0, "slow": 0}
    for item in items:
        rel = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        if rel.startswith(ALONE):
            item.add_marker(pytest.mark.alone)
        counts[category(item)] += 1
    config.stash[COUNTS] = counts


def start_record() -> dict:
    with open(START_RECORD, encoding="utf-8") as f:
        return json.load(f)


def whole_tree_collected(config: pytest.Config) -> bool:
    """True when the run collected every test file (no paths or node ids named)."""
    testpaths = [os.path.join(str(config.rootpath), p) for p in config.getini("testpaths")]
    named = [os.path.abspath(a.split("::")[0]) for a in config.args]
    return not config.args or sorted(named) == sorted(os.path.abspath(p) for p in testpaths)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:  # noqa: ARG001
    counts = config.stash.get(COUNTS, None)
    if counts is not None and whole_tree_collected(config):
        start = start_record()
        together = counts["default"] + counts["interop"]
        terminalreporter.write_line(
            f"collection: default {counts['default']}, interop {counts['interop']}, "
            f"slow {counts['slow']}; default + interop {together} against the default "
            f"{start['default']} at {start['commit']}"
        )
    budget = config.getoption("--time-budget")
    if budget is not None:
        elapsed = time.monotonic() - config.stash[STARTED]
        verdict = "within" if elapsed <= budget else "OVER"
        terminalreporter.write_line(
            f"run time: {elapsed:.0f} s, {verdict} the budget of {budget:.0f} s"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    budget = session.config.getoption("--time-budget")
    if budget is None or exitstatus != 0:
        return
    elapsed = time.monotonic() - session.config.stash[STARTED]
    if elapsed > budget:
        print(
            f"\nthe run took {elapsed:.0f} s, over its budget of {budget:.0f} s: see the slowest "
            "tests above; move a long run under `slow` with a bounded sample in the default run"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


if __name__ == "__main__":  # the paths `make test`'s second pass collects
    print(" ".join(ALONE))
