"""Seed derivation: every random draw in stoker is a pure function of named integers.

The same (seed, epoch, global index) gives the same augmentation whichever process does the
work and however many workers there are.

Per-sample generators are counter-based (Philox, Random123): the key is (seed, domain) and the
sample's (index, epoch) sit in the high words of the 256-bit counter, so every sample owns a
stream of 2^128 blocks that no other sample's stream reaches. Making one costs a few
microseconds; :class:`SampleRngs` re-keys a single generator in under one, which matters when
it is done for every sample of every epoch, and :meth:`SampleRngs.first_blocks` computes the
first block of many samples' streams at once, for a loop whose samples draw no more than that.
"""

from __future__ import annotations

import secrets

import numpy as np

__all__ = ["SampleRngs", "fresh_seed", "sample_rng", "stream_rng"]

# Distinct domain tags keep the streams for different purposes independent.
_DOMAIN_SAMPLE = 0x5A4D_504C  # per-sample augmentation
_DOMAIN_STREAM = 0x5354_524D  # orders, samplers and other whole-epoch streams
_U64 = (1 << 64) - 1

# Philox4x64-10 (Random123, as numpy's Philox runs it): the round multipliers, the key bumps
_PHILOX_M0, _PHILOX_M1 = 0xD2E7470EE14C6C93, 0xCA5A826395121157
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B
_LOW32, _SHIFT32, _SHIFT53 = np.uint64(0xFFFF_FFFF), np.uint64(32), np.uint64(11)
_M = np.array([[_PHILOX_M0], [_PHILOX_M1]], np.uint64)
_M_LOW, _M_HIGH = _M & _LOW32, _M >> _SHIFT32
_PHILOX_BUMP = np.array([[_PHILOX_W0], [_PHILOX_W1]], np.uint64)


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

    def first_blocks(self, indices: np.ndarray) -> np.ndarray:
        """``[at(i).random(4) for i in indices]`` as one ``(n, 4)`` float64 array, computed
        for all ``indices`` at once (about a microsecond a sample, where re-keying the
        generator and drawing costs several): the first Philox block of each sample's stream
        in numpy's order, each 64-bit word as ``Generator.random`` makes a double of it (its
        top 53 bits over 2^53). The same bits, so a loop may take a sample's first draws from
        here and re-key the generator only for a sample that needs more."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and (int(idx.min()) < 0)):
            raise ValueError("indices must be a 1-D array of non-negative ints")
        state = self._fresh["state"]
        key, counter = state["key"], state["counter"]
        n = len(idx)
        # words (v0, v2) and (v1, v3) of each sample's counter block; a fresh stream's first
        # draw steps v0 from 0 to 1 (no carry)
        even = np.empty((2, n), np.uint64)
        even[0] = 1
        even[1] = idx
        odd = np.zeros((2, n), np.uint64)
        odd[1] = counter[3]
        k = np.array(key, np.uint64).reshape(2, 1)
        for r in range(10):
            if r:
                k += _PHILOX_BUMP  # wraps, as the key bump does
            hi, lo = _mulhilo(even)
            # (v0, v1, v2, v3) <- (hi1 ^ v1 ^ k0, lo1, hi0 ^ v3 ^ k1, lo0)
            hi = hi[::-1]
            hi ^= odd
            hi ^= k
            even, odd = hi, lo[::-1]
        words = np.empty((n, 4), np.uint64)
        words[:, 0::2] = even.T
        words[:, 1::2] = odd.T
        words >>= _SHIFT53
        return words * (1.0 / 9007199254740992.0)


def _mulhilo(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The high and low 64-bit words of ``a[0] * M0`` and ``a[1] * M1`` (uint64 rows) through
    32-bit halves: numpy has no 64x64 -> 128-bit multiply."""
    al = a & _LOW32
    ah = a >> _SHIFT32
    ll = al * _M_LOW
    hl = ah * _M_LOW
    al *= _M_HIGH  # lh
    ah *= _M_HIGH  # hh
    ll >>= _SHIFT32
    ll += al
    ll += hl & _LOW32  # the middle column with the low product's carry: below 2^64
    hl >>= _SHIFT32
    ah += hl
    ll >>= _SHIFT32
    ah += ll
    return ah, a * _M


def stream_rng(seed: int, *words: int) -> np.random.Generator:
    """A generator for a whole-epoch stream (an order, a sampler draw), keyed by ``words``."""
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence([_DOMAIN_STREAM, seed, *words]))
    )


def fresh_seed() -> int:
    """A new random 63-bit seed, for ``seed=None``; callers store it so a resumed run is exact."""
    return secrets.randbits(63)
