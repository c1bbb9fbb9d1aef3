"""A Lightning fit over a ``StatefulDataLoader`` of ``RecordDataset`` with a stoker sampler, as
``docs/resume.md`` gives it. Run as a script: ``lightning_fit.py SET[,SET] LOG CKPT_DIR KILL_AT
WORKERS [resume]``. Each training step appends its epoch, step and a digest of the batch's
pixels and labels to LOG; at step KILL_AT (0: never) the process SIGKILLs itself; ``resume``
fits from the newest checkpoint in CKPT_DIR."""

from __future__ import annotations

import hashlib
import os
import signal
import sys

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

from stoker.sampling import EpochOrder, MixtureOrder
from stoker.torch import RecordDataset
from stoker.transforms import Compose, HorizontalFlip, RandomCrop


class Model(pl.LightningModule):
    def __init__(self, log: str, kill_at: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.log_path, self.kill_at = log, kill_at

    def on_train_epoch_start(self) -> None:
        # Lightning sets the sampler's epoch; the dataset's (the augmentation) is ours to set
        self.trainer.train_dataloader.dataset.set_epoch(self.current_epoch)

    def training_step(self, batch, batch_idx):
        if self.kill_at and self.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        images, labels = batch
        digest = hashlib.sha256(images.numpy().tobytes() + labels.numpy().tobytes())
        with open(self.log_path, "a") as f:
            f.write(f"{self.current_epoch} {self.global_step} {digest.hexdigest()[:16]}\n")
        x = images.float().mean(dim=(1, 2))
        return torch.nn.functional.cross_entropy(self.lin(x), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(path: str, log: str, ckpt_dir: str, kill_at: int, workers: int, resume: bool) -> None:
    sets = path.split(",")  # several: a mixture of 42 draws an epoch, as one set's 42 samples
    tf = Compose([RandomCrop(40), HorizontalFlip()])
    ds = RecordDataset(sets if len(sets) > 1 else path, transforms=tf, seed=7)
    sampler = (
        MixtureOrder(ds.sizes, [0.75, 0.25], epoch_size=42, seed=3)
        if len(sets) > 1
        else EpochOrder(len(ds), shuffle=True, seed=3)
    )
    dl = StatefulDataLoader(ds, batch_size=6, sampler=sampler, num_workers=workers)
    every = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=3, save_top_k=-1)
    trainer = pl.Trainer(
        max_epochs=3,
        callbacks=[every],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    ckpt = None
    if resume:
        ckpt = max((os.path.join(ckpt_dir, n) for n in os.listdir(ckpt_dir)), key=os.path.getmtime)
    trainer.fit(Model(log, kill_at), dl, ckpt_path=ckpt)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], int(a[3]), int(a[4]), a[5:] == ["resume"])
