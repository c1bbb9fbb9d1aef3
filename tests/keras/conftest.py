"""Keras 3 runs on the torch backend here (CPU); the backend is chosen before keras loads."""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "torch")


import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _worker_server():
    """The loader's worker server lives as long as the test process: start it before the
    first leak check takes its snapshot."""
    from stoker.loader import warm_up

    warm_up()
    yield
