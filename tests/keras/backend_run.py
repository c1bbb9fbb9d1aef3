"""fit, evaluate and predict through ``KerasDataset`` on the backend ``KERAS_BACKEND`` names.

Keras fixes its backend when it is first imported, so ``test_backends.py`` runs this script
in a process of its own per backend (``tensorflow``, ``torch``), as a user's training script
runs. It prints one JSON report as the last line of stdout; the test asserts on it. Each run:

- ``fit``, 3 epochs with validation, on 2 loader workers (plus 1 for validation), while a
  callback counts the processes below this one and this process's shared-memory segments;
- ``fit`` on a set whose labels are the sample ids, with a metric that counts the samples
  trained on exactly once per epoch (every one, in every epoch);
- ``evaluate`` and ``predict`` on a held-out set with a short last batch; ``predict`` also on
  the plain arrays, to compare row by row;
- a ``fit`` stopped after its first batch, the dataset closed at once (under TensorFlow a
  ``tf.data`` thread may still be waiting for the next batch then);
- after every dataset is closed: the workers and segments this script made, which must be gone.

``argv[1]``: seconds after which the script dumps every thread's stack and exits (a freeze).
"""

from __future__ import annotations

import faulthandler
import glob
import json
import os
import sys
import time

import numpy as np
import psutil

WORKERS = 2


def main() -> None:
    faulthandler.dump_traceback_later(float(sys.argv[1]), exit=True)
    t0 = time.monotonic()
    backend = os.environ["KERAS_BACKEND"]
    leave_workers_their_cores(backend)

    import keras

    from stoker.loader import warm_up

    assert keras.backend.backend() == backend, keras.backend.backend()
    keras.utils.set_random_seed(0)  # the models' initial weights
    warm_up()  # the worker server lives as long as this process: not a leftover
    procs = Processes()
    report: dict = {"backend": backend, "import_s": time.monotonic() - t0}
    model = learn(keras, procs, report)
    every_sample_once(keras, report)
    evaluate_and_predict(keras, model, report)
    stop_after_one_batch(keras, model, procs, report)
    procs.leftovers(report)
    report["total_s"] = time.monotonic() - t0
    print(json.dumps(report), flush=True)


def leave_workers_their_cores(backend: str) -> None:
    """The model trains on the CPU here: its threads get the cores the workers do not."""
    threads = max(1, (os.cpu_count() or 1) - WORKERS)
    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)


class Processes:
    """This process's descendants and shared-memory segments, against those at the start."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.shm = f"/dev/shm/stoker_{os.getpid()}_*"
        self.base = self.below()
        self.base_direct = {p.pid for p in self.me.children()}
        self.seen: dict[int, float] = {}  # pid -> create_time of every process seen below
        self.most = self.most_direct = self.most_segments = 0

    def below(self) -> set[int]:
        return {p.pid for p in self.me.children(recursive=True)}

    def look(self) -> None:
        """Record what runs now: loader workers are grandchildren (the worker server starts
        them); a Keras pool would fork direct children."""
        for p in self.me.children(recursive=True):
            try:
                self.seen.setdefault(p.pid, p.create_time())
            except psutil.Error:
                pass
        direct = {p.pid for p in self.me.children()}
        self.most = max(self.most, len(self.below() - self.base))
        self.most_direct = max(self.most_direct, len(direct - self.base_direct))
        self.most_segments = max(self.most_segments, len(glob.glob(self.shm)))

    def leftovers(self, report: dict) -> None:
        deadline = time.monotonic() + 5
        while True:
            left, segments = self.below() - self.base, glob.glob(self.shm)
            if (not left and not segments) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        report["left_processes"] = sorted(left)
        report["left_segments"] = sorted(segments)
        report["seen_processes"] = sorted(self.seen.items())


def learn(keras, procs: Processes, report: dict):
    """fit, 3 epochs with validation, on loader workers: the loss goes down."""
    from keras_data import quadrant_images

    import stoker
    from stoker.keras import KerasDataset

    class Watch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            procs.look()

    x, y = quadrant_images(512, 32)
    train = stoker.Loader((x[:448], y[:448]), batch_size=64, shuffle=True, seed=0, workers=WORKERS)
    val = stoker.Loader((x[448:], y[448:]), batch_size=64, workers=1)
    model = cnn(keras)
    t = time.monotonic()
    with KerasDataset(train, x_dtype="float32") as tr, KerasDataset(val, x_dtype="float32") as va:
        hist = model.fit(tr, validation_data=va, epochs=3, verbose=0, callbacks=[Watch()])
    report["fit_s"] = time.monotonic() - t
    report["history"] = {k: [float(v) for v in vs] for k, vs in hist.history.items()}
    report["most_processes"] = procs.most
    report["most_direct_children"] = procs.most_direct
    report["most_segments"] = procs.most_segments
    return model


def every_sample_once(keras, report: dict) -> None:
    """fit on a set whose labels are the sample ids: how many were trained on exactly once in
    each epoch."""
    import stoker
    from stoker.keras import KerasDataset

    n = 96
    x = np.random.default_rng(1).integers(0, 256, (n, 8, 8), dtype=np.uint8)
    model = keras.Sequential(
        [keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(n)]
    )
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[once_metric(keras, n)],
    )
    loader = stoker.Loader((x, np.arange(n)), batch_size=16, shuffle=True, seed=5, workers=WORKERS)
    with KerasDataset(loader, x_dtype="float32") as ds:
        hist = model.fit(ds, epochs=2, verbose=0)
    report["trained_once"] = [float(v) for v in hist.history["once"]]


def evaluate_and_predict(keras, model, report: dict) -> None:
    """evaluate, and predict compared row by row with predict on the arrays, on held-out
    samples (200 = 3 x 64 + 8: a short last batch), each on a dataset of its own."""
    from keras_data import quadrant_images

    import stoker
    from stoker.keras import KerasDataset

    x, y = quadrant_images(200, 32, seed=1)
    t = time.monotonic()
    with KerasDataset(
        stoker.Loader((x, y), batch_size=64, workers=WORKERS), x_dtype="float32"
    ) as ds:
        logs = model.evaluate(ds, verbose=0, return_dict=True)
    with KerasDataset(
        stoker.Loader((x, y), batch_size=64, workers=WORKERS), x_dtype="float32"
    ) as ds:
        out = model.predict(ds, verbose=0)
    report["evaluate_predict_s"] = time.monotonic() - t
    report["evaluate"] = {k: float(v) for k, v in logs.items()}
    want = model.predict(x[..., None].astype(np.float32) / np.float32(255), verbose=0)
    report["predict_shape"] = list(out.shape)
    report["predict_rows_match"] = bool(
        out.shape == want.shape and np.allclose(out, want, atol=1e-4)
    )
    report["predict_accuracy"] = float(np.mean(np.argmax(out, axis=1) == y))


def stop_after_one_batch(keras, model, procs: Processes, report: dict) -> None:
    """fit stopped after its first batch and the dataset closed at once (under TensorFlow a
    tf.data thread may still be waiting for the next batch then)."""
    from keras_data import quadrant_images

    import stoker
    from stoker.keras import KerasDataset

    class StopAfterOne(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            procs.look()
            self.model.stop_training = True

    x, y = quadrant_images(512, 32)
    loader = stoker.Loader((x, y), batch_size=32, shuffle=True, seed=0, workers=WORKERS)
    with KerasDataset(loader, x_dtype="float32") as ds:
        hist = model.fit(ds, epochs=5, verbose=0, callbacks=[StopAfterOne()])
    report["stopped_epochs"] = len(hist.history["loss"])


def cnn(keras):
    model = keras.Sequential(
        [
            keras.Input((32, 32, 1)),
            keras.layers.Conv2D(8, 3, strides=2, activation="relu"),
            keras.layers.MaxPooling2D(4),
            keras.layers.Flatten(),
            keras.layers.Dense(4),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def once_metric(keras, n: int):
    """A metric whose value is how many of the ``n`` samples (labels are sample ids) the
    epoch trained on exactly once; Keras resets it at each epoch."""
    ops = keras.ops

    class TrainedOnce(keras.metrics.Metric):
        def __init__(self):
            super().__init__(name="once")
            self.counts = self.add_variable(shape=(n,), initializer="zeros", name="counts")

        def update_state(self, y_true, y_pred, sample_weight=None):
            ids = ops.reshape(ops.cast(y_true, "int32"), (-1,))
            self.counts.assign_add(ops.sum(ops.one_hot(ids, n), axis=0))

        def result(self):
            return ops.sum(ops.cast(ops.equal(self.counts, 1.0), "float32"))

        def reset_state(self):
            self.counts.assign(ops.zeros((n,)))

    return TrainedOnce()


if __name__ == "__main__":  # loader workers need the guard
    main()
