"""Real Keras 3 ``model.fit`` (torch backend, CPU) fed by the adapter on the portable engine
(spawned workers, a named shared-memory ring): what macOS and Windows get, and what a Linux
user gets once CUDA is initialised. It trains on the very batches the Linux engine gives.
"""

from __future__ import annotations

import glob
import os
import random

import keras
import numpy as np
import psutil
import pytest
import torch
from backend_run import cnn
from keras_data import quadrant_images

import stoker.keras

pytestmark = pytest.mark.timeout(120)


def _model(weights=None) -> keras.Model:
    # the seeds set_random_seed sets, without it: it imports TensorFlow where that is
    # installed, whose protos clash with the tfrecord package's in one test process
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = cnn(keras)
    if weights is not None:
        model.set_weights(weights)
    return model


def _first_epoch(ds) -> list:
    """Epoch 1's batches, pulled before ``fit`` (the adapter keeps them and serves them to it)."""
    return [tuple(np.array(a) for a in ds[i]) for i in range(len(ds))]


def _fit(engine: str, x, y, weights, *, epochs: int = 2):
    model = _model(weights)
    with stoker.keras.dataset(
        (x, y), batch_size=64, shuffle=True, seed=5, workers=2, engine=engine, x_dtype="float32"
    ) as ds:
        assert (ds.loader.engine, ds.loader.workers) == (engine, 2)
        start = ds.loader.start_method
        first = _first_epoch(ds)
        hist = model.fit(ds, epochs=epochs, verbose=0)
    return model, hist.history["loss"], start, first


def _linux_first_epoch(x, y) -> list:
    with stoker.keras.dataset(
        (x, y), batch_size=64, shuffle=True, seed=5, workers=2, engine="linux", x_dtype="float32"
    ) as ds:
        return _first_epoch(ds)


def test_fit_on_the_portable_engine_learns_from_the_linux_engines_batches():
    x, y = quadrant_images(384, 32)
    shm = f"/dev/shm/stoker_{os.getpid()}_*"
    before = set(glob.glob(shm))
    kids = {p.pid for p in psutil.Process().children(recursive=True)}
    _, loss, start, first = _fit("portable", x, y, None)
    assert start == "spawn"
    assert len(loss) == 2 and loss[-1] < loss[0]
    want = _linux_first_epoch(x, y)
    assert len(first) == len(want) == 6
    for got, ref in zip(first, want):
        for a, b in zip(got, ref):
            np.testing.assert_array_equal(a, b)
    # closing the dataset ended the spawned workers and unlinked the ring
    left = {p.pid for p in psutil.Process().children(recursive=True)} - kids
    assert not [p for p in left if psutil.pid_exists(p) and "spawn" in _cmd(p)]
    assert set(glob.glob(shm)) <= before


@pytest.mark.slow
def test_fit_on_either_engine_ends_with_the_same_weights():
    """From the same weights, three epochs on each engine: the same updates, so the same
    losses and weights (the batches, their order and the augmentation are the loader's)."""
    x, y = quadrant_images(384, 32)
    weights = _model().get_weights()
    portable, loss, _, _ = _fit("portable", x, y, weights, epochs=3)
    linux, linux_loss, _, _ = _fit("linux", x, y, weights, epochs=3)
    np.testing.assert_allclose(loss, linux_loss, rtol=1e-5)
    for a, b in zip(portable.get_weights(), linux.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _cmd(pid: int) -> str:
    try:
        return " ".join(psutil.Process(pid).cmdline())
    except psutil.Error:
        return ""
