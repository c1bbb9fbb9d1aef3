"""Pack test fixtures. The packer's process pools run on multiprocessing's forkserver, which
(with its resource tracker) lives as long as the test process: both are started once here,
before the first test, so that the leak check sees them as already there. The pool workers
themselves must be gone after each test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _forkserver():
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()
    forkserver.ensure_running()
    yield
