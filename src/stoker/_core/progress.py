"""A tiny progress protocol: long work reports through an object with ``update(n)`` and ``close()``.

``make_progress`` returns a tqdm bar on a terminal (or when forced) and a silent counter otherwise,
so library code never prints unless asked.
"""

from __future__ import annotations

import sys
from typing import Protocol

__all__ = ["Progress", "SilentProgress", "make_progress"]


class Progress(Protocol):
    def update(self, n: int = 1) -> object: ...
    def set_postfix_str(self, s: str) -> object: ...
    def close(self) -> object: ...


class SilentProgress:
    """Counts and says nothing."""

    def __init__(self, total: int | None = None) -> None:
        self.total = total
        self.n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def make_progress(
    total: int | None, desc: str, *, unit: str = "img", enabled: bool | None = None
) -> Progress:
    """A bar with rate and ETA on stderr when ``enabled`` (default: when stderr is a terminal)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return SilentProgress(total)
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit=unit, unit_scale=True, dynamic_ncols=True, file=sys.stderr
    )
