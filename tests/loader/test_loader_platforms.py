"""Where the Linux engine cannot run (not Linux: no memfd, no posix_fallocate, no fork server),
the default is the portable engine (spawn, named shared memory), with the same batches;
asking for the Linux engine there is one sentence naming the engine that runs."""

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
        return [b.images.copy() for b in ld], ld.engine


def test_asking_for_the_linux_engine_is_one_clear_sentence(windows):
    assert "win32 lacks memfd_create, posix_fallocate" in _pool.engine_unsupported()
    with pytest.raises(stoker.LoaderError, match=r"engine='linux' needs Linux.*'portable' runs"):
        stoker.Loader((X, None), batch_size=4, workers=2, engine="linux")


def test_the_default_is_the_portable_engine_with_the_same_batches(windows):
    got, engine = _batches(workers=2)
    assert engine == "portable"
    want, _ = _batches(workers=0)
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_this_machine_runs_the_linux_engine_by_default():
    assert _pool.engine_unsupported() is None
    with stoker.Loader((X, None), batch_size=4, workers=1) as ld:
        assert (ld.engine, ld.start_method) == ("linux", "forkserver")


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="engine must be one of 'linux', 'portable'"):
        stoker.Loader((X, None), batch_size=4, engine="fork")


def test_a_folder_listing_crosses_by_name_without_memfd(windows, folder):
    """Without memfd a folder's listing is a named segment that spawned workers map."""
    from stoker.transforms import Resize

    runs = []
    for workers in (0, 2):
        with stoker.Loader(
            folder, batch_size=8, workers=workers, seed=2, transforms=Resize((16, 16))
        ) as ld:
            runs.append([(b.keys.copy(), b.images.copy()) for b in ld])
            named = type(ld.source._shared).__name__ == "NamedRing"
            assert named == bool(workers)
    assert len(runs[0]) == len(runs[1]) == 6
    for (k1, i1), (k2, i2) in zip(*runs):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(i1, i2)
