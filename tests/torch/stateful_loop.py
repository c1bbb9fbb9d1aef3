"""A torchdata ``StatefulDataLoader`` over ``stoker.torch.RecordDataset`` with a stoker sampler,
as a training script builds it; run as a script it is the process that stops after some
batches (``stop``) or the new process that resumes from the saved state (``resume``).

The state goes through a JSON file, as a checkpoint of a training loop would hold it."""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
from torchdata.stateful_dataloader import StatefulDataLoader

from stoker.sampling import ClassBalanced, EpochOrder, LengthBuckets, MixtureOrder
from stoker.torch import RecordDataset
from stoker.transforms import Compose, HorizontalFlip, RandomCrop

BATCH = 6
#: (sampler kind, DataLoader workers)
CONFIGS = [(kind, w) for kind in ("order", "balanced", "buckets") for w in (0, 2)]
CONFIGS.append(("mixture", 2))  # the dataset's state in each worker too


def build(path: str, kind: str, workers: int) -> tuple[RecordDataset, StatefulDataLoader]:
    """``path``: sets joined by commas; a ``mixture`` reads them all, the other kinds the first."""
    sets = path.split(",")
    tf = Compose([RandomCrop(40), HorizontalFlip()])
    ds = RecordDataset(sets if kind == "mixture" else sets[0], transforms=tf, seed=7)
    labels = np.asarray(ds.targets)
    if kind == "mixture":
        sampler = MixtureOrder(ds.sizes, [0.75, 0.25], shuffle=True, seed=3)
    elif kind == "order":
        sampler = EpochOrder(len(ds), shuffle=True, seed=3)
    elif kind == "balanced":
        sampler = ClassBalanced(labels, seed=3)
    else:
        lengths = (np.arange(len(ds)) * 7) % 11  # stands for a text label's length
        sampler = LengthBuckets(lengths, batch_size=BATCH, num_buckets=3, seed=3)
    dl = StatefulDataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers)
    return ds, dl


def digest(batch: list) -> str:
    images, labels = batch
    return hashlib.blake2b(images.numpy().tobytes() + labels.numpy().tobytes()).hexdigest()


def run_epochs(ds: RecordDataset, dl: StatefulDataLoader, epochs: range, stop: int | None):
    """Digests of the batches of ``epochs``; with ``stop``, the state after that many batches
    of the last epoch and the digests so far."""
    out = []
    for epoch in epochs:
        dl.sampler.set_epoch(epoch)
        ds.set_epoch(epoch)
        for n, batch in enumerate(dl):
            out.append(digest(batch))
            if stop is not None and epoch == epochs[-1] and n + 1 == stop:
                return out, dl.state_dict()
    return out, None


def main(mode: str, path: str, state_file: str, out_file: str, stop: int) -> None:
    states, digests = {}, {}
    saved = {} if mode == "stop" else json.load(open(state_file))
    for kind, workers in CONFIGS:
        name = f"{kind}-{workers}"
        ds, dl = build(path, kind, workers)
        if mode == "stop":  # epoch 0 whole, then `stop` batches of epoch 1
            digests[name], states[name] = run_epochs(ds, dl, range(2), stop)
        else:  # a new process: fresh objects at epoch 0; the state says epoch 1
            dl.load_state_dict(saved[name])
            digests[name] = [digest(b) for b in dl]  # the rest of epoch 1
    if mode == "stop":
        with open(state_file, "w") as f:
            json.dump(states, f)
    with open(out_file, "w") as f:
        json.dump(digests, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
