"""Layer 3: the loader engine (worker processes, shared-memory batch ring) and its sources."""

from stoker.loader._keep import release_workers
from stoker.loader._node import node_loaders
from stoker.loader._pool import warm_up
from stoker.loader._shm import cleanup_stale
from stoker.loader.batch import Batch
from stoker.loader.loader import Loader
from stoker.loader.preempt import Preempted, on_sigterm
from stoker.loader.prefetch import prefetch
from stoker.loader.sources import ArraySource, FolderSource, RecordSource, Source, as_source

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
    "node_loaders",
    "release_workers",
    "on_sigterm",
    "prefetch",
    "warm_up",
]
