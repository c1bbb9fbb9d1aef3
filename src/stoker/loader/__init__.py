"""Layer 3: the loader engine (worker processes, shared-memory batch ring) and its sources.

The public names load on first use: a worker server imports the modules its workers run
(``_worker`` and what it needs) through this package, and must not pay for the main
process's side of the engine (``Loader``, the ring's bookkeeping, kept pools, prefetch) before
the first batch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

_LAZY: dict[str, str] = {
    "ArraySource": "stoker.loader.sources",
    "Batch": "stoker.loader.batch",
    "FolderSource": "stoker.loader.sources",
    "Loader": "stoker.loader.loader",
    "Preempted": "stoker.loader.preempt",
    "RecordSource": "stoker.loader.sources",
    "Source": "stoker.loader.sources",
    "as_source": "stoker.loader.sources",
    "cleanup_stale": "stoker.loader._shm",
    "node_loaders": "stoker.loader._node",
    "on_sigterm": "stoker.loader.preempt",
    "open_source": "stoker.loader._mixture",
    "release_workers": "stoker.loader._keep",
    "warm_up": "stoker.loader._pool",
}

__all__ = sorted([*_LAZY, "prefetch"])


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'stoker.loader' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """This package's module type: ``prefetch`` names the function whether or not its module
    ``stoker.loader.prefetch`` was imported first (an import binds a submodule to its name
    on the package, and the function has the module's name)."""

    @property
    def prefetch(self) -> Any:
        from stoker.loader.prefetch import prefetch

        return prefetch

    @prefetch.setter
    def prefetch(self, value: Any) -> None:  # the submodule's import binding itself: kept out
        pass


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # pragma: no cover
    from stoker.loader._keep import release_workers
    from stoker.loader._node import node_loaders
    from stoker.loader._pool import warm_up
    from stoker.loader._shm import cleanup_stale
    from stoker.loader.batch import Batch
    from stoker.loader.loader import Loader
    from stoker.loader.preempt import Preempted, on_sigterm
    from stoker.loader.prefetch import prefetch
    from stoker.loader.sources import ArraySource, FolderSource, RecordSource, Source, as_source
