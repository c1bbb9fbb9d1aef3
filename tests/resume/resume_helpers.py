"""Loader factories and transforms for the check-resume tests. They live in a module of their
own so that check-resume's child processes (spawned) and the loaders' workers import them."""

from __future__ import annotations

import numpy as np

from stoker._core.specs import ArraySpec
from stoker.loader import Loader
from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize
from stoker.transforms.base import Transform


def augment() -> Compose:
    """Random augmentation from the rng the loader hands in: resumable."""
    return Compose([Resize(40, shorter_side=True), RandomCrop(32), HorizontalFlip()])


class GlobalRandomFlip(Transform):
    """Flips from numpy's global generator, not the rng handed in: not resumable."""

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.ascontiguousarray(img[:, ::-1]) if np.random.rand() < 0.5 else img

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        return in_spec


class CountingFlip(Transform):
    """Flips the images of its first 4 calls (a warm-up): its output depends on how many calls
    came before, which a restart sets back to 0."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        self.calls += 1
        return np.ascontiguousarray(img[::-1]) if self.calls <= 4 else img

    def output_spec(self, in_spec: ArraySpec) -> ArraySpec:
        return in_spec


class ForgetfulLoader(Loader):
    """A loader whose load_state_dict does nothing: every restart begins the run again."""

    def load_state_dict(self, state: dict) -> None:
        pass


def every_rank_rank_0(path: str, *, rank: int, world_size: int) -> Loader:
    """A factory that forgets to pass the rank on: every rank reads the whole set."""
    return Loader(path, batch_size=8, shuffle=True, seed=5, workers=0)


def forgetful(path: str, *, rank: int, world_size: int) -> Loader:
    return ForgetfulLoader(
        path,
        batch_size=8,
        transforms=augment(),
        shuffle=True,
        seed=5,
        workers=0,
        rank=rank,
        world_size=world_size,
    )


def counting() -> Compose:
    """``augment()`` then :class:`CountingFlip`: not resumable."""
    return Compose([augment(), CountingFlip()])


def one_rank(path: str) -> Loader:
    """A factory that takes no ``rank`` or ``world_size`` (bound to its set with a partial)."""
    return Loader(path, batch_size=8, shuffle=True, seed=5, workers=0)
