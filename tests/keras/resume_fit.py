"""A Keras fit through ``stoker.keras.fit_resumable`` (torch backend), as a training script runs
it: ``resume_fit.py SET[,SET] LOG CKPT_DIR KILL_AT WORKERS`` (several sets: a mixture). Every
batch the loader delivers is appended to LOG (epoch, batch number, a digest of its pixels and
labels); at train step KILL_AT (0: never) the process SIGKILLs itself, after that step's
checkpoint, if any, is written. A second run with the same CKPT_DIR resumes from its newest
checkpoint."""

from __future__ import annotations

import hashlib
import os
import signal
import sys

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402

import stoker  # noqa: E402
from stoker.keras import fit_resumable  # noqa: E402
from stoker.transforms import Compose, HorizontalFlip, RandomCrop  # noqa: E402


class LoggedLoader(stoker.Loader):
    """A loader that notes each batch it delivers."""

    log = ""

    def __iter__(self):
        for batch in super().__iter__():
            digest = hashlib.sha256(batch.images.tobytes() + batch.labels.tobytes())
            with open(self.log, "a") as f:
                f.write(f"{batch.epoch} {batch.number} {digest.hexdigest()[:16]}\n")
            yield batch


class KillAt(keras.callbacks.Callback):
    def __init__(self, step: int) -> None:
        super().__init__()
        self.step, self.done = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        if self.step and self.done == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def tiny_model(size: int) -> keras.Model:
    """Pooled pixels to 3 logits: small enough to train in a test, real enough to checkpoint."""
    # seeded initialisers, not keras.utils.set_random_seed: that imports TensorFlow where it
    # is installed, whose protos clash with the tfrecord package's in one test process
    dense = keras.layers.Dense(
        3, kernel_initializer=keras.initializers.GlorotUniform(seed=0), bias_initializer="zeros"
    )
    model = keras.Sequential(
        [keras.Input((size, size, 3)), keras.layers.GlobalAveragePooling2D(), dense]
    )
    model.compile(
        optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def main(path: str, log: str, folder: str, kill_at: int, workers: int) -> None:
    model = tiny_model(40)
    tf = Compose([RandomCrop(40), HorizontalFlip()])
    sets = path.split(",")  # several: a mixture of 42 draws an epoch, as one set's 42 samples
    mixed = {"weights": [0.75, 0.25], "epoch_size": 42} if len(sets) > 1 else {}
    source = sets if mixed else path
    loader = LoggedLoader(
        source, batch_size=6, transforms=tf, shuffle=True, seed=3, workers=workers, **mixed
    )
    loader.log = log
    with loader:
        # the kill counts this process's steps; the checkpoint callback runs first
        fit_resumable(
            model,
            loader,
            epochs=3,
            folder=folder,
            every=3,
            dataset_options={"x_dtype": "float32"},
            callbacks=[KillAt(kill_at)],
            verbose=0,
        )
    np.save(os.path.join(folder, "weights-end.npy"), model.layers[-1].get_weights()[0])


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], int(a[3]), int(a[4]))
