"""Several sets read as one: :class:`MixtureSource`, the sets laid end to end behind the one
read contract, read by draw id (``stoker.sampling.mixture``'s NOTE: ``id % total`` is the
position in the sets laid end to end, so a repeat of a sample is the same read)."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from stoker._core.errors import SpecError
from stoker.formats import Reader
from stoker.sampling.mixture import mixture_quotas, set_of

__all__ = ["MixtureSource"]


def let_go(reader: Any) -> None:
    """A set in object storage keeps none of its shards held in this process."""
    if (remote := reader.remote()) is not None:
        remote.let_go()


class MixtureSource(Reader):
    """``readers`` (each any format, local or remote) laid end to end, drawn at ``weights``
    (``epoch_size``: draws per epoch, ``None``: the default rule; see
    :class:`~stoker.sampling.MixtureOrder`). ``label_offsets``: added to each set's integer
    labels (``None``: the label spaces stay per set). ``owned``: the readers it closes.

    Positions, keys and labels run through the sets in order; :meth:`reader`, :meth:`key` and
    :meth:`describe` take draw ids (any int whose remainder by ``len()`` is a position)."""

    def __init__(
        self,
        readers: list[Reader],
        weights: Any,
        *,
        epoch_size: int | None = None,
        label_offsets: list[int] | None = None,
        owned: list[bool] | None = None,
    ) -> None:
        self.readers = list(readers)
        self.sizes = np.array([len(r) for r in self.readers], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self._starts = self.offsets[:-1].tolist()
        mixture_quotas(self.sizes, weights, epoch_size)  # bad weights are refused here
        self.weights = [float(w) for w in np.asarray(weights, dtype=np.float64).tolist()]
        self.epoch_size = epoch_size
        self.owned = list(owned) if owned is not None else [False] * len(self.readers)
        self.label_offsets = None if label_offsets is None else [int(o) for o in label_offsets]
        kind = self._shared([r.label_kind() for r in self.readers], "labels (shape, dtype)")
        if self.label_offsets is not None and (kind[0] or kind[1][0] not in "iu"):
            raise SpecError(f"label_offset= needs integer class labels; the sets have {kind}")
        self.let_go()  # a remote set's first shard, read for its labels, is not kept pinned
        codings = {r.encoded for r in self.readers}
        self.encoded = codings.pop() if len(codings) == 1 else None
        self.path = self.readers[0].path

    def _name(self, s: int) -> str:
        r = self.readers[s]
        return f"set {s} ({r.path or type(r).__name__})"

    def _shared(self, values: list[Any], what: str) -> Any:
        """``values[0]``, every set's being equal; else a ``SpecError`` naming two sets."""
        for s, v in enumerate(values):
            if v != values[0]:
                one, other = (x.describe() if hasattr(x, "describe") else x for x in (values[0], v))
                raise SpecError(
                    f"the sets' {what} differ: {self._name(0)} has {one}, {self._name(s)} "
                    f"{other}; a mixture's sets share one"
                )
        return values[0]

    def _where(self, i: int) -> tuple[int, int]:
        """``(set, position in the set)`` of draw id ``i``."""
        pos = int(i) % int(self.offsets[-1])
        s = bisect.bisect_right(self._starts, pos) - 1
        return s, pos - self._starts[s]

    def set_of(self, ids: np.ndarray) -> np.ndarray:
        """int64: the set of each draw id (``batch.source``)."""
        return set_of(self.offsets, ids)

    def _local(self, ids: np.ndarray, s: int) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        return ids[self.set_of(ids) == s] % int(self.offsets[-1]) - self.offsets[s]

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def keys(self) -> np.ndarray:
        return np.concatenate([np.asarray(r.keys(), dtype=np.int64) for r in self.readers])

    def key(self, i: int) -> int:
        s, j = self._where(i)
        return self.readers[s].key(j)

    def labels(self) -> np.ndarray:
        parts = [np.asarray(r.labels()) for r in self.readers]
        if self.label_offsets is not None:
            parts = [p.astype(np.int64) + o for p, o in zip(parts, self.label_offsets)]
        return np.concatenate(parts)

    def label_kind(self) -> tuple[tuple[int, ...], str]:
        shape, dtype = self.readers[0].label_kind()
        return (tuple(shape), "int64" if self.label_offsets is not None else dtype)

    @property
    def sample_spec(self) -> Any:
        return self._shared([r.sample_spec for r in self.readers], "images")

    @property
    def schema(self) -> Any:
        """The sets' schema when they share one, else an image and the label."""
        schemas = [r.schema for r in self.readers]
        if all(sc == schemas[0] for sc in schemas) and self.label_offsets is None:
            return schemas[0]
        return super().schema

    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()) -> Any:
        made: dict[int, Any] = {}
        if indices is not None:  # each set's reader made once, with the chunk's positions
            sets = np.unique(self.set_of(indices)).tolist()
            made = {s: self.readers[s].reader(self._local(indices, s), fields) for s in sets}
        shift = self.label_offsets

        def get(i: int) -> tuple[Any, Any, int, dict[str, Any]]:
            s, j = self._where(i)
            read = made.get(s)
            if read is None:
                read = made[s] = self.readers[s].reader(None, fields)
            image, label, key, vals = read(j)
            return image, label if shift is None else int(label) + shift[s], key, vals

        return get

    def read(self, i: int) -> tuple[Any, Any]:
        """One sample (the loader's probes at open); its set keeps nothing pinned after, so
        that the probes of one remote set do not hold cache room while another's are read."""
        s, j = self._where(i)
        try:
            image, label, _key, _vals = self.reader(np.array([i], np.int64))(i)
            return bytes(image) if isinstance(image, memoryview) else image, label
        finally:
            let_go(self.readers[s])

    def describe(self, i: int) -> str:
        s, j = self._where(i)
        return f"{self.readers[s].describe(j)} (set {s} of the mixture)"

    def files(self) -> list[str]:
        return [f for r in self.readers for f in r.files()]

    def share(self) -> None:
        for r in self.readers:
            r.share()

    def remote(self) -> Any:
        """What the loader asks of the sets in object storage, together (``None`` when every
        set is local)."""
        return self if any(r.remote() is not None for r in self.readers) else None

    def probe_positions(self, probes: int) -> list[int] | None:
        """A few positions of every set (a remote set's own: its first shard)."""
        each = max(1, probes // len(self.readers))
        out: list[int] = []
        for s, r in enumerate(self.readers):
            n = len(r)
            spread = np.unique(np.linspace(0, n - 1, num=min(n, each)).astype(np.int64))
            remote = r.remote()
            mine = None if remote is None else remote.probe_positions(each)
            out += [int(p) + self._starts[s] for p in (spread if mine is None else mine)]
        return out

    def read_ahead(self, order: np.ndarray, start: int = 0) -> Any:
        """Each remote set's downloads ahead of its part of ``order`` (draw ids)."""
        order = np.asarray(order, dtype=np.int64)
        sets = self.set_of(order)
        parts = []
        for s, r in enumerate(self.readers):
            if (remote := r.remote()) is None:
                continue
            seen = np.concatenate([[0], np.cumsum(sets == s)])
            ahead = remote.read_ahead(self._local(order, s), int(seen[start]))
            if ahead is not None:
                parts.append((ahead, seen))
        return _Ahead(parts) if parts else None

    def let_go(self) -> None:
        for r in self.readers:
            let_go(r)

    def fingerprint(self) -> dict:
        return {
            "type": "mixture",
            "sets": [r.fingerprint() for r in self.readers],
            "weights": self.weights,
            "epoch_size": self.epoch_size,
            "label_offsets": self.label_offsets,
        }

    def close(self) -> None:
        for r, own in zip(self.readers, self.owned):
            if own:
                r.close()
        self.owned = [False] * len(self.readers)


class _Ahead:
    """The read-aheads of a mixture's remote sets: position ``p`` of the mixture's order is
    position ``seen[p]`` of a set's part of it."""

    def __init__(self, parts: list[tuple[Any, np.ndarray]]) -> None:
        self.parts = parts

    def reached(self, p: int) -> None:
        for ahead, seen in self.parts:
            ahead.reached(int(seen[min(p, len(seen) - 1)]))

    def close(self) -> None:
        for ahead, _ in self.parts:
            ahead.close()
