"""The sampler contract: which global indices one rank sees in one epoch, in order.

A sampler is a pure function of its configuration and the epoch number; it holds no
iteration state except ``epoch`` (for ``torch.utils.data.DataLoader`` compatibility, where
``__iter__`` yields the current epoch's indices and ``set_epoch`` is honoured).

- ``s.indices(epoch) -> ndarray[int64]``: this rank's global positions for ``epoch``;
- ``len(s)``: how many indices each epoch has on this rank (the same for every epoch);
- ``s.batch_widths(epoch, batch_size)``: per-batch target widths, or ``None`` (the default) when
  batches need no per-batch shape; a length-bucketing sampler returns one width per batch;
- ``s.variable_width``: ``True`` when ``batch_widths`` gives widths (the loader then sizes its
  slots for the widest batch and hands each batch its width); ``False`` by default;
- ``s.variable_size``: ``True`` when each batch is padded to its largest sample in height and
  width (aspect-ratio buckets); the loader then reads the stored sizes from the source
  (``image_sizes()``), sizes its slots for the largest batch, and carries the ``size`` field;
- ``s.fingerprint()``: a JSON-safe description, stored in loader state and compared on resume.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np

from stoker.sampling._checks import check_epoch

__all__ = ["Sampler"]


class Sampler(abc.ABC):
    epoch: int = 0
    variable_width: bool = False
    variable_size: bool = False

    @abc.abstractmethod
    def indices(self, epoch: int) -> np.ndarray: ...

    @abc.abstractmethod
    def __len__(self) -> int: ...

    def batch_widths(self, epoch: int, batch_size: int) -> np.ndarray | None:
        return None

    def fingerprint(self) -> dict:
        return {"type": type(self).__name__}

    def shard_span(self, records: int, shard_sizes: np.ndarray) -> int | None:
        """At most how many shards any ``records`` consecutive positions of this rank's order
        touch, in any epoch, for a set whose shards hold ``shard_sizes`` records; ``None``
        when that is every shard (an order that draws from the whole set). A remote set's
        cache must hold this many shards at once (``docs/remote.md``)."""
        return None

    # torch.utils.data.Sampler compatibility
    def set_epoch(self, epoch: int) -> None:
        self.epoch = check_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices(self.epoch).tolist())
