"""Loader test fixtures: tiny real datasets (the worker servers are started once per session by
tests/conftest.py, before the first leak check)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from loader_helpers import make_arrays, make_folder


@pytest.fixture(scope="session")
def folder(tmp_path_factory) -> str:
    """40 JPEGs (36x40) and 2 PNGs in 3 class folders."""
    root = tmp_path_factory.mktemp("images")
    make_folder(str(root), n=42, size=(36, 40))
    return str(root)


@pytest.fixture(scope="session")
def arrays() -> tuple[np.ndarray, np.ndarray]:
    return make_arrays(60)


@pytest.fixture
def shm_names():
    """Names of this process's stoker segments in /dev/shm (a function, evaluated when called;
    other test runs on the machine make their own)."""
    prefix = f"stoker_{os.getpid()}_"

    def names() -> set[str]:
        return {n for n in os.listdir("/dev/shm") if n.startswith(prefix)}

    return names
