"""What a ``torch.utils.data.DataLoader`` user types, and what a ``Loader`` takes instead:
an unknown keyword argument gets the stoker spelling by name, not a bare ``TypeError``."""

from __future__ import annotations

__all__ = ["DATALOADER_NAMES"]

#: torch.utils.data.DataLoader's names, and what a Loader takes instead.
DATALOADER_NAMES = {
    "num_workers": "stoker's name is workers= (workers=0 also runs in the main process)",
    "prefetch_factor": "stoker's name is prefetch= (batches ready ahead, for all workers)",
    "persistent_workers": "stoker's workers always persist across epochs; drop it",
    "pin_memory": "pinning and the copy to the GPU are stoker.torch.CudaPrefetcher's job",
    "batch_sampler": "pass a stoker.sampling sampler as sampler=",
    "collate_fn": "batches are already arrays in shared memory; stoker.torch converts them",
    "worker_init_fn": "transforms get their rng from (seed, epoch, index); nothing to seed",
    "generator": "pass seed= (an int)",
}
