"""Layer 3: the loader engine (worker processes, shared-memory batch ring) and its sources."""

from stoker.loader._shm import cleanup_stale
from stoker.loader.engine import Batch, Loader, warm_up
from stoker.loader.preempt import Preempted, on_sigterm
from stoker.loader.sources import ArraySource, FolderSource, RecordSource, Source, as_source

try:
    from stoker.loader.prefetch import prefetch
except ImportError:  # pragma: no cover - written by the GPU-edge room
    prefetch = None  # type: ignore[assignment]

__all__ = [
    "ArraySource",
    "Batch",
    "FolderSource",
    "Loader",
    "Preempted",
    "RecordSource",
    "Source",
    "as_source",
    "cleanup_stale",
    "on_sigterm",
    "prefetch",
    "warm_up",
]
