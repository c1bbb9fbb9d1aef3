"""The reader contract every format implements.

A reader gives random access by position ``i`` in ``[0, len(r))``:

- ``len(r)``: number of records;
- ``r.key(i)``: the record's integer key (what ``.idx`` files and error messages name);
- ``r.read(i)``: the record's payload as a ``memoryview`` (valid until ``close``);
- ``r.close()``.

Readers cross process boundaries by pickling only what is needed to reopen them (paths and
options), never open handles: ``__getstate__``/``__setstate__`` reopen in the worker.
"""

from __future__ import annotations

import abc
from types import TracebackType

__all__ = ["Reader"]


class Reader(abc.ABC):
    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def key(self, i: int) -> int: ...

    @abc.abstractmethod
    def read(self, i: int) -> memoryview: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    def _check_index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record position {i} out of range for {n} records")
        return i + n if i < 0 else i

    def __enter__(self):
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
