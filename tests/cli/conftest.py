"""CLI test fixtures: the forkserver (and its resource tracker) that `stoker pack` and
`stoker sample-data` use live as long as the test process; start them once, before the first
test, so that the leak check sees them as already there."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _forkserver():
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()
    forkserver.ensure_running()
    yield
