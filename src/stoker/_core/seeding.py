"""Seed derivation: every random draw in stoker is a pure function of named integers.

The same (seed, epoch, global index) gives the same augmentation whichever process does the
work and however many workers there are.
"""

from __future__ import annotations

import secrets

import numpy as np

__all__ = ["fresh_seed", "sample_rng", "stream_rng"]

# Distinct domain tags keep the streams for different purposes independent.
_DOMAIN_SAMPLE = 0x5A4D_504C  # per-sample augmentation
_DOMAIN_STREAM = 0x5354_524D  # orders, samplers and other whole-epoch streams


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator a transform gets for sample ``index`` (global position in the dataset)."""
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([_DOMAIN_SAMPLE, seed, epoch, index]))
    )


def stream_rng(seed: int, *words: int) -> np.random.Generator:
    """A generator for a whole-epoch stream (an order, a sampler draw), keyed by ``words``."""
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([_DOMAIN_STREAM, seed, *words]))
    )


def fresh_seed() -> int:
    """A new random 63-bit seed, for ``seed=None``; callers store it so a resumed run is exact."""
    return secrets.randbits(63)
