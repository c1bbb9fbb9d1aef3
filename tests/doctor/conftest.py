"""The loader's worker server lives as long as the test process: start it before the first
leak check takes its snapshot."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _worker_server():
    from stoker.loader import warm_up

    warm_up()
    yield
