"""Hold a logger at ERROR for a while: for a caller that reports the warnings itself."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["quiet_logger"]


@contextlib.contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """Logger ``name`` at ERROR while the block runs (its own level before and after)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)
