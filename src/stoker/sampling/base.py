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

Iterating (``torch.utils.data.DataLoader(sampler=s)``) also keeps a position:
``s.state_dict()`` is ``{"version", "sampler" (the fingerprint), "epoch", "yielded"}`` (JSON),
how far into which epoch the iteration has handed out positions, and ``s.load_state_dict(st)``
makes the next iteration continue that epoch from there. torchdata's ``StatefulDataLoader``
calls both (it saves the sampler's state with the loader's and restores it before it
iterates again), so a ``DataLoader`` over ``stoker.torch.RecordDataset`` resumes mid-epoch.
Nothing is drawn to resume: the position is an offset into ``indices(epoch)``.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np

from stoker._core.errors import IncompatibleStateError
from stoker.sampling._checks import check_epoch, check_int

__all__ = ["Sampler"]

#: ``Sampler.state_dict()["version"]``
STATE_VERSION = 1
_STATE_KEYS = ("epoch", "sampler", "version", "yielded")


class Sampler(abc.ABC):
    epoch: int = 0
    variable_width: bool = False
    variable_size: bool = False
    _resume: tuple[int, int] | None = (
        None  # (epoch, start) a loaded state asks of the next iteration
    )
    _position: tuple[int, int] | None = None  # (epoch, positions handed out) of the iteration

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
        """Iterate ``epoch`` next; a loaded state of another epoch no longer applies."""
        self.epoch = check_epoch(epoch)
        if self._resume is not None and self._resume[0] != self.epoch:
            self._resume = None

    def __iter__(self) -> Iterator[int]:
        """This epoch's positions; after ``load_state_dict``, those it had not handed out.
        The position is taken when the iteration starts, not at its first item."""
        epoch = self.epoch
        resume, self._resume = self._resume, None
        start = resume[1] if resume is not None and resume[0] == epoch else 0
        self._position = (epoch, start)
        return self._hand_out(self.indices(epoch)[start:].tolist(), epoch, start)

    def _hand_out(self, rest: list[int], epoch: int, start: int) -> Iterator[int]:
        for n, i in enumerate(rest, start + 1):
            self._position = (epoch, n)
            yield i

    # resuming
    def state_dict(self, *, consumed: int | None = None) -> dict:
        """Where the iteration is, as JSON: the epoch and how many of its positions were
        handed out (``yielded``). ``consumed``: how many the training loop has taken instead,
        for a plain ``torch.utils.data.DataLoader``, whose workers fetch ahead of the loop
        (batches done x batch size); a ``StatefulDataLoader`` keeps count itself."""
        epoch, yielded = self._position or (self.epoch, 0)
        if consumed is not None:
            yielded = check_int("consumed", consumed, minimum=0, maximum=len(self))
        return {
            "version": STATE_VERSION,
            "sampler": self.fingerprint(),
            "epoch": epoch,
            "yielded": yielded,
        }

    def load_state_dict(self, state: dict) -> None:
        """The next iteration continues ``state``'s epoch after the positions it had handed
        out. A state of another sampler (type, seed, rank, world size, data, ...) raises
        ``IncompatibleStateError`` naming the first field that differs; a malformed one
        ``ValueError``/``TypeError`` naming the field."""
        if not isinstance(state, dict):
            raise TypeError(f"a sampler state is a dict, got {type(state).__name__}")
        keys = sorted(state)
        if keys != list(_STATE_KEYS):
            raise ValueError(
                f"a sampler state has the fields {list(_STATE_KEYS)}, got {keys} (a loader "
                "state? that one goes to Loader.load_state_dict)"
            )
        if state["version"] != STATE_VERSION:
            raise ValueError(f"sampler state version {state['version']!r} is not {STATE_VERSION}")
        mine = self.fingerprint()
        theirs = state["sampler"]
        if theirs != mine:
            if not isinstance(theirs, dict):
                raise TypeError(f"sampler: expected a fingerprint dict, got {theirs!r}")
            names = sorted(set(mine) | set(theirs), key=lambda k: (k != "type", k))
            field = next(k for k in names if mine.get(k) != theirs.get(k))
            raise IncompatibleStateError(
                f"sampler {field}: the state was saved with {field}={theirs.get(field)!r}, this "
                f"{type(self).__name__} has {field}={mine.get(field)!r}"
            )
        epoch = check_epoch(state["epoch"])
        yielded = check_int("yielded", state["yielded"], minimum=0, maximum=len(self))
        self.epoch = epoch
        self._resume = (epoch, yielded)
        self._position = (epoch, yielded)
