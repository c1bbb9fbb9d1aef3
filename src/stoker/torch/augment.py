"""Batch-level augmentation on the device: random horizontal flip and random erasing.

Both take an NCHW float batch and a ``torch.Generator`` on the batch's device and draw all their
randomness from it, without a host synchronisation. ``batch_generator(seed, epoch, number,
device)`` gives the generator the prefetcher uses, so the result is a pure function of (seed,
epoch, batch number) on a given device type (CPU and CUDA generators draw different streams).
"""

from __future__ import annotations

import math

import torch

from stoker._core.seeding import stream_rng

__all__ = ["ERASE_AREA", "ERASE_RATIO", "batch_generator", "random_erase", "random_flip"]

_DOMAIN_AUGMENT = 0x4750_5541  # "GPUA": keeps these draws apart from other seeded streams

ERASE_AREA = (0.02, 1 / 3)  # erased fraction of the image area
ERASE_RATIO = (0.3, 1 / 0.3)  # aspect ratio (height / width) of the erased rectangle


def batch_generator(seed: int, epoch: int, number: int, device: torch.device) -> torch.Generator:
    """A generator on ``device`` seeded from (seed, epoch, batch number)."""
    word = int(stream_rng(seed, _DOMAIN_AUGMENT, epoch, number).integers(0, 2**63 - 1))
    g = torch.Generator(device=device)
    g.manual_seed(word)
    return g


def random_flip(x: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """Mirror each image of an NCHW batch left-right with probability ``p``."""
    if x.ndim != 4:
        raise ValueError(f"random_flip needs an NCHW batch, got shape {tuple(x.shape)}")
    flip = torch.rand(x.shape[0], generator=generator, device=x.device) < p
    return torch.where(flip.view(-1, 1, 1, 1), x.flip(-1), x)


def random_erase(
    x: torch.Tensor,
    p: float,
    generator: torch.Generator,
    *,
    value: float = 0.0,
    area: tuple[float, float] = ERASE_AREA,
    ratio: tuple[float, float] = ERASE_RATIO,
) -> torch.Tensor:
    """With probability ``p`` per image, fill one random rectangle (all channels) with ``value``.

    The rectangle covers ``area`` (fraction of H*W, uniform) with an aspect ratio drawn
    log-uniformly from ``ratio``, clipped to the image. After normalisation ``value=0`` is the
    dataset mean colour.
    """
    if x.ndim != 4:
        raise ValueError(f"random_erase needs an NCHW batch, got shape {tuple(x.shape)}")
    n, _, h, w = x.shape
    dev = x.device
    r = torch.rand(n, 5, generator=generator, device=dev, dtype=torch.float32)
    apply = r[:, 0] < p
    a = (area[0] + (area[1] - area[0]) * r[:, 1]) * (h * w)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * r[:, 2])
    eh = torch.sqrt(a * aspect).round().clamp(1, h)
    ew = torch.sqrt(a / aspect).round().clamp(1, w)
    top = torch.floor(r[:, 3] * (h - eh + 1)).clamp(max=h - 1)
    left = torch.floor(r[:, 4] * (w - ew + 1)).clamp(max=w - 1)
    rows = torch.arange(h, device=dev, dtype=torch.float32).view(1, h)
    cols = torch.arange(w, device=dev, dtype=torch.float32).view(1, w)
    in_rows = (rows >= top.view(n, 1)) & (rows < (top + eh).view(n, 1))
    in_cols = (cols >= left.view(n, 1)) & (cols < (left + ew).view(n, 1))
    mask = (in_rows.view(n, 1, h, 1) & in_cols.view(n, 1, 1, w)) & apply.view(n, 1, 1, 1)
    return x.masked_fill(mask, value)
