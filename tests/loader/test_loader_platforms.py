"""Where the worker engine cannot run (not Linux: no memfd, no posix_fallocate, no fork
server), the Loader says so in one sentence naming the fallback, before any process starts;
with the default worker count it falls back to workers=0 and still gives the same batches."""

from __future__ import annotations

import os
import sys

import numpy as np
import numpy.testing  # noqa: F401 - imported before a test pretends to be another platform
import pytest

import stoker
from stoker.loader import _pool

X = np.random.default_rng(0).integers(0, 255, (10, 8, 8, 3), dtype=np.uint8)


@pytest.fixture
def windows(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.delattr(os, "posix_fallocate")


def _batches(**kw):
    with stoker.Loader((X, np.arange(10)), batch_size=4, seed=1, shuffle=True, **kw) as ld:
        return [b.images.copy() for b in ld], ld.workers


def test_asking_for_workers_is_one_clear_sentence(windows):
    assert "win32 lacks memfd_create, posix_fallocate" in _pool.engine_unsupported()
    with pytest.raises(stoker.LoaderError, match=r"workers=2: .* need Linux .* pass workers=0"):
        stoker.Loader((X, None), batch_size=4, workers=2)


def test_the_default_falls_back_to_the_main_process_with_the_same_batches(windows):
    with pytest.warns(RuntimeWarning, match="using workers=0"):
        got, workers = _batches()
    assert workers == 0
    want, _ = _batches(workers=0)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_this_machine_runs_the_engine():
    assert _pool.engine_unsupported() is None
