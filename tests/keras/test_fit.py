"""Real Keras 3 ``model.fit`` (torch backend, CPU) on stoker's worker processes.

Each test checks what a user relies on: training completes and learns; a worker's error
comes out of ``fit`` naming the sample; stopping early (a callback, Ctrl-C) leaves no
process and no shared-memory segment behind. The autouse ``no_leaks`` fixture re-checks.
"""

from __future__ import annotations

import gc
import glob
import os

import keras
import numpy as np
import psutil
import pytest
from keras_data import POISON, FailOnPoison, decode_index, index_images, quadrant_images

import stoker
from stoker.keras import KerasDataset

pytestmark = pytest.mark.timeout(120)

SHM = f"/dev/shm/stoker_{os.getpid()}_*"  # ours only: other processes may run loaders too


def children(*, recursive: bool = True) -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=recursive)}


def cnn(size: int = 32, classes: int = 4) -> keras.Model:
    model = keras.Sequential(
        [
            keras.Input((size, size, 1)),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.MaxPooling2D(4),
            keras.layers.Flatten(),
            keras.layers.Dense(classes),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


class CountChildren(keras.callbacks.Callback):
    """The most processes below this one, and direct children, started since construction.

    Loader workers are started by the worker server (grandchildren); a Keras pool would fork
    direct children of this process."""

    def __init__(self) -> None:
        super().__init__()
        self.base, self.base_direct = children(), children(recursive=False)
        self.most = self.most_direct = 0

    def on_train_batch_end(self, batch, logs=None):
        self.most = max(self.most, len(children() - self.base))
        self.most_direct = max(self.most_direct, len(children(recursive=False) - self.base_direct))


def test_fit_three_epochs_with_validation_on_two_workers():
    x, y = quadrant_images(512, 32)
    shm_before, kids_before = set(glob.glob(SHM)), children()
    train = stoker.Loader((x[:448], y[:448]), batch_size=64, shuffle=True, seed=0, workers=2)
    val = stoker.Loader((x[448:], y[448:]), batch_size=64, workers=1)
    counter = CountChildren()
    model = cnn()
    with KerasDataset(train, x_dtype="float32") as tr, KerasDataset(val, x_dtype="float32") as va:
        hist = model.fit(tr, validation_data=va, epochs=3, verbose=0, callbacks=[counter])
    loss = hist.history["loss"]
    assert len(loss) == 3 and len(hist.history["val_loss"]) == 3
    assert loss[-1] < loss[0]
    assert hist.history["val_accuracy"][-1] > 0.5  # 4 classes: chance is 0.25
    # stoker's workers did the work (2 train + 1 validation); Keras started no pool
    assert 2 <= counter.most <= 3 and counter.most_direct == 0
    assert children() - kids_before == set()
    assert set(glob.glob(SHM)) - shm_before == set()


def test_every_epoch_of_fit_sees_each_sample_exactly_once():
    """fit(shuffle=True) permutes batch indices and an unbuilt model is built from a peeked
    batch; still, each Keras epoch trains on every sample once (the loader's epoch)."""

    class Record(keras.layers.Layer):
        def __init__(self, sink, **kw):
            super().__init__(**kw)
            self.sink = sink  # a function: Keras would replace a list attribute by a copy

        def call(self, inputs, training=None):
            if training and inputs.device.type != "meta":
                self.sink(decode_index(inputs.detach().cpu().numpy()))
            return inputs

    n = 96
    x, y = index_images(n)
    seen: list = []
    model = keras.Sequential(
        [keras.Input((8, 8, 1)), Record(seen.append), keras.layers.Flatten(), keras.layers.Dense(n)]
    )
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(True))
    loader = stoker.Loader((x, y), batch_size=16, shuffle=True, seed=5, workers=2)
    with KerasDataset(loader) as ds:
        model.fit(ds, epochs=2, verbose=0)
    assert len(seen) == 2 * 6
    epochs = [np.concatenate(seen[:6]), np.concatenate(seen[6:])]
    for ep in epochs:
        assert sorted(ep.tolist()) == list(range(n))
    assert not np.array_equal(epochs[0], epochs[1])


def test_worker_error_surfaces_from_fit_naming_the_sample():
    x, y = quadrant_images(256, 32)
    x[37] = POISON
    loader = stoker.Loader(
        (x, y), batch_size=32, transforms=FailOnPoison(), workers=2, shuffle=False
    )
    model = cnn()
    with KerasDataset(loader) as ds, pytest.raises(ValueError) as err:
        model.fit(ds, epochs=1, verbose=0)
    assert isinstance(err.value, stoker.WorkerError)
    assert err.value.index == 37
    assert "37" in str(err.value) and "poisoned sample" in str(err.value)


def test_stop_training_after_one_batch_cleans_up():
    class StopAfterOne(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = True

    x, y = quadrant_images(512, 32)
    shm_before, kids_before = set(glob.glob(SHM)), children()
    loader = stoker.Loader((x, y), batch_size=32, shuffle=True, seed=0, workers=2)
    model = cnn()
    with KerasDataset(loader, x_dtype="float32") as ds:
        hist = model.fit(ds, epochs=5, verbose=0, callbacks=[StopAfterOne()])
    assert len(hist.history["loss"]) == 1
    assert children() - kids_before == set()
    assert set(glob.glob(SHM)) - shm_before == set()


def test_keyboard_interrupt_in_fit_cleans_up():
    class CtrlC(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                raise KeyboardInterrupt

    x, y = quadrant_images(512, 32)
    shm_before, kids_before = set(glob.glob(SHM)), children()
    loader = stoker.Loader((x, y), batch_size=32, shuffle=True, seed=0, workers=2)
    model = cnn()
    with pytest.raises(KeyboardInterrupt), KerasDataset(loader) as ds:
        model.fit(ds, epochs=3, verbose=0, callbacks=[CtrlC()])
    assert children() - kids_before == set()
    assert set(glob.glob(SHM)) - shm_before == set()


def test_forgotten_dataset_is_cleaned_up_when_collected():
    x, y = quadrant_images(256, 32)
    shm_before, kids_before = set(glob.glob(SHM)), children()
    ds = KerasDataset(stoker.Loader((x, y), batch_size=32, workers=2))
    cnn().fit(ds, epochs=1, verbose=0)
    del ds
    gc.collect()
    assert children() - kids_before == set()
    assert set(glob.glob(SHM)) - shm_before == set()


def test_evaluate_and_predict():
    x, y = quadrant_images(200, 32)  # 200 = 3 batches of 64 + 8: the last batch is short
    model = cnn()
    with KerasDataset(stoker.Loader((x, y), batch_size=64, workers=2)) as ds:
        logs = model.evaluate(ds, verbose=0, return_dict=True)
        out = model.predict(ds, verbose=0)
    assert set(logs) >= {"loss", "accuracy"}
    assert out.shape == (200, 4)
