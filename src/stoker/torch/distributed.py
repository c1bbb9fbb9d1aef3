"""Rank and world size from ``torch.distributed``."""

from __future__ import annotations

import torch.distributed as dist

__all__ = ["distributed_info"]


def distributed_info() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised default process group, else ``(0, 1)``.

    Pass them to ``stoker.Loader(..., rank=, world_size=)`` or a sampler to give each rank its
    share of every epoch (the loader also looks them up itself when they are left out).

    Unlike ``stoker._core.system.dist_rank`` (the loader's lookup), this reads no ``RANK`` /
    ``WORLD_SIZE`` variables: it answers for the process group only.
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
