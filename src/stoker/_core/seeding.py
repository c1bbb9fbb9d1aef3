"""Seed derivation: every random draw in stoker is a pure function of named integers.

The same (seed, epoch, global index) gives the same augmentation whichever process does the
work and however many workers there are.

Per-sample generators are counter-based (Philox, Random123): the key is (seed, domain) and the
sample's (index, epoch) sit in the high words of the 256-bit counter, so every sample owns a
stream of 2^128 blocks that no other sample's stream reaches. Making one costs a few
microseconds; :class:`SampleRngs` re-keys a single generator in under one, which matters when
it is done for every sample of every epoch.
"""

from __future__ import annotations

import secrets

import numpy as np

__all__ = ["SampleRngs", "fresh_seed", "sample_rng", "stream_rng"]

# Distinct domain tags keep the streams for different purposes independent.
_DOMAIN_SAMPLE = 0x5A4D_504C  # per-sample augmentation
_DOMAIN_STREAM = 0x5354_524D  # orders, samplers and other whole-epoch streams
_U64 = (1 << 64) - 1


def _words(value: int, what: str) -> tuple[int, int]:
    """A non-negative int below 2^128 as (low, high) 64-bit words."""
    v = int(value)
    if v < 0 or v >> 128:
        raise ValueError(f"{what} must be an int in [0, 2**128), got {value!r}")
    return v & _U64, v >> 64


def _sample_key(seed: int) -> np.ndarray:
    lo, hi = _words(seed, "seed")
    return np.array([lo, hi ^ (_DOMAIN_SAMPLE << 32)], dtype=np.uint64)


def _sample_counter(epoch: int, index: int) -> np.ndarray:
    e, e_hi = _words(epoch, "epoch")
    i, i_hi = _words(index, "index")
    if e_hi or i_hi:
        raise ValueError(f"epoch and index must be below 2**64, got {epoch}, {index}")
    return np.array([0, 0, i, e], dtype=np.uint64)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator a transform gets for sample ``index`` (global position in the dataset).

    A new, independent generator per call; :meth:`SampleRngs.at` gives the same stream cheaper.
    """
    bits = np.random.Philox(counter=_sample_counter(epoch, index), key=_sample_key(seed))
    return np.random.Generator(bits)


class SampleRngs:
    """``sample_rng(seed, epoch, i)`` for many ``i`` through one re-keyed generator.

    ``at(i)`` returns the same Generator object each time, reset to sample ``i``'s stream:
    the previous one stops being valid. For one worker's loop over its samples; use
    :func:`sample_rng` when generators must live side by side.
    """

    def __init__(self, seed: int, epoch: int) -> None:
        self._bits = np.random.Philox(counter=_sample_counter(epoch, 0), key=_sample_key(seed))
        self._fresh = self._bits.state  # empty output buffer: the next draw starts the block
        self._counter = self._fresh["state"]["counter"]
        self.generator = np.random.Generator(self._bits)

    def at(self, index: int) -> np.random.Generator:
        if not 0 <= index <= _U64:
            raise ValueError(f"index must lie in [0, 2**64), got {index}")
        self._counter[2] = index
        self._bits.state = self._fresh
        return self.generator


def stream_rng(seed: int, *words: int) -> np.random.Generator:
    """A generator for a whole-epoch stream (an order, a sampler draw), keyed by ``words``."""
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([_DOMAIN_STREAM, seed, *words]))
    )


def fresh_seed() -> int:
    """A new random 63-bit seed, for ``seed=None``; callers store it so a resumed run is exact."""
    return secrets.randbits(63)
