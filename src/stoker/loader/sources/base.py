"""What the loader reads: :class:`~stoker.formats.Reader`, the one read contract every format
implements (``stoker.formats.base`` says what it asks and what it defaults). ``Source`` is
that class under the loader's older name; an image folder and in-memory arrays are readers
whose keys are their positions (:class:`PositionKeyed`)."""

from __future__ import annotations

import numpy as np

from stoker.formats import Reader
from stoker.formats.base import sha

__all__ = ["PositionKeyed", "Source", "sha"]

#: The loader's name for :class:`~stoker.formats.Reader` (a custom source subclasses it).
Source = Reader


class PositionKeyed(Reader):
    """A reader whose sample keys are their positions (a folder listing, array rows)."""

    _unit = "samples"  # what a position counts, in the out-of-range message

    def key(self, i: int) -> int:
        if not 0 <= i < len(self):
            raise IndexError(f"position {i} out of range for {len(self)} {self._unit}")
        return int(i)

    def keys(self) -> np.ndarray:
        return np.arange(len(self), dtype=np.int64)
