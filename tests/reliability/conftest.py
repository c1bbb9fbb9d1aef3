"""The reliability suite's fixtures (docs/reliability.md, faults.md section C); the figures
table they record into is ``tests/figures_plugin.py``.

The corpus of bad inputs comes from ``scripts/make_fault_corpus.py`` (imported here as
``make_fault_corpus``), written once per session into a temporary folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _reliability_util import load_corpus_module

# --------------------------------------------------------------------------- corpus


@pytest.fixture(scope="session")
def corpus_root(tmp_path_factory) -> Path:
    """Every variant of the bad-input corpus, written once per session."""
    root = tmp_path_factory.mktemp("fault-corpus")
    load_corpus_module().write_corpus(root)
    return root


def pytest_configure(config):  # noqa: ARG001
    """F-13's children run against a patched copy of ``src/``: make sure it is the one imported."""
    expect = os.environ.get("STOKER_EXPECT_SRC")
    if expect:
        import stoker

        if not os.path.realpath(stoker.__file__).startswith(os.path.realpath(expect)):
            raise pytest.UsageError(f"stoker imported from {stoker.__file__}, not from {expect}")
