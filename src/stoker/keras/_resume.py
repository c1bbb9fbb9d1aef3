"""Resuming a Keras ``fit`` mid-epoch: the loader's state saved with the model's weights.

A checkpoint is a folder ``step-NNNNNNNNN`` holding ``model.weights.h5`` and ``loader.json``
(``{"steps", "loader"}``: the train batches done and ``loader.state_dict()`` after them),
both written before ``latest`` (a one-line file, written as ``*.partial`` and renamed) names
the folder: a kill at any point leaves ``latest`` naming a whole checkpoint. The two newest
checkpoints are kept.

Resuming runs the rest of the interrupted epoch as a ``fit`` of its own (a ``KerasDataset``
of that many steps: Keras fixes an epoch's steps before it starts), then the remaining
epochs, so Keras epoch *k* stays loader epoch *k* and every batch is the one an
uninterrupted fit trains on.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

from stoker._core.atomic import write_bytes_atomic
from stoker._core.checks import check_int
from stoker.keras._dataset import KerasDataset, keras

__all__ = ["LoaderCheckpoint", "fit_resumable"]

_LATEST = "latest"
_KEEP = 2


class LoaderCheckpoint(keras.callbacks.Callback):
    """Every ``every`` train batches, the model's weights and the loader's state, together, in
    ``folder`` (see the module docstring). Batches are counted across ``fit`` calls
    (``steps``; a resumed fit starts from the checkpoint's count).

    The loader's state is taken when Keras reports the batch done, so Keras must not have
    asked for batches ahead of it: true of the torch backend, which calls the dataset from
    the thread that runs ``fit``, one batch per step. Other backends are refused: tensorflow
    reads ahead through ``tf.data``, and jax is not tested (save at epoch ends there:
    ``docs/keras.md``)."""

    def __init__(self, loader: Any, folder: str | os.PathLike[str], *, every: int) -> None:
        super().__init__()
        backend = keras.backend.backend()
        if backend != "torch":
            raise ValueError(
                f"LoaderCheckpoint saves mid-epoch, which needs the torch backend, got "
                f"{backend!r}: it reads no batch ahead of the step it trains (tensorflow's "
                "tf.data does); save the loader's state at epoch ends there (docs/keras.md)"
            )
        self.loader = loader
        self.folder = os.fspath(folder)
        self.every = check_int("every", every, minimum=1)
        self.steps = 0

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.steps += 1
        if self.steps % self.every == 0:
            self.save()

    def save(self) -> str:
        """Write a checkpoint of now; returns its folder."""
        name = f"step-{self.steps:09d}"
        where = os.path.join(self.folder, name)
        os.makedirs(where, exist_ok=True)
        weights = os.path.join(where, "model.weights.h5")
        partial = os.path.join(where, "model.partial.weights.h5")  # keras wants the suffix
        self.model.save_weights(partial)
        os.replace(partial, weights)
        state = {"steps": self.steps, "loader": self.loader.state_dict()}
        write_bytes_atomic(os.path.join(where, "loader.json"), json.dumps(state).encode())
        write_bytes_atomic(os.path.join(self.folder, _LATEST), name.encode())
        for old in sorted(n for n in os.listdir(self.folder) if n.startswith("step-"))[:-_KEEP]:
            shutil.rmtree(os.path.join(self.folder, old), ignore_errors=True)
        return where


def latest_checkpoint(folder: str | os.PathLike[str]) -> str | None:
    """The folder of the newest whole checkpoint in ``folder``, or ``None``."""
    path = os.path.join(os.fspath(folder), _LATEST)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return os.path.join(os.fspath(folder), f.read().strip())


def fit_resumable(
    model: Any,
    loader: Any,
    *,
    epochs: int,
    folder: str | os.PathLike[str],
    every: int,
    dataset_options: dict[str, Any] | None = None,
    callbacks: list[Any] | None = None,
    **fit_options: Any,
) -> LoaderCheckpoint:
    """``model.fit`` over ``loader`` for ``epochs`` epochs that saves a checkpoint every
    ``every`` batches in ``folder`` and, when ``folder`` already holds one, resumes from it:
    the weights and the loader's state are loaded, the rest of the interrupted epoch runs,
    then the remaining epochs. ``dataset_options`` go to each ``KerasDataset`` (``x_dtype``,
    ``scale``, ...), ``fit_options`` to each ``fit``. Returns the checkpoint callback."""
    epochs = check_int("epochs", epochs, minimum=1)
    saver = LoaderCheckpoint(loader, folder, every=every)
    opts = dict(dataset_options or {})
    extra = list(callbacks or [])
    start = latest_checkpoint(folder)
    if start is not None:
        with open(os.path.join(start, "loader.json"), encoding="utf-8") as f:
            saved = json.load(f)
        model.load_weights(os.path.join(start, "model.weights.h5"))
        loader.load_state_dict(saved["loader"])
        saver.steps = int(saved["steps"])
    epoch = loader.epoch
    done = loader.state_dict()["batch"]
    if 0 < done < len(loader) and epoch < epochs:  # the rest of the interrupted epoch
        rest = KerasDataset(loader, steps=len(loader) - done, close_loader=False, **opts)
        with rest:
            model.fit(
                rest,
                initial_epoch=epoch,
                epochs=epoch + 1,
                callbacks=[saver, *extra],
                **fit_options,
            )
        epoch += 1
    if epoch < epochs:
        with KerasDataset(loader, close_loader=False, **opts) as ds:
            model.fit(
                ds, initial_epoch=epoch, epochs=epochs, callbacks=[saver, *extra], **fit_options
            )
    return saver
