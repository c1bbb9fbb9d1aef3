"""stoker: keep the GPU fed.

``import stoker`` is cheap: it imports neither torch, keras nor cv2. Public names are loaded
on first use from the room that owns them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stoker._core import errors as _errors
from stoker._core.errors import (
    CacheFullError,
    CheckResumeError,
    ChildTraceback,
    CorruptRecordError,
    ImageDecodeError,
    ImageTooLargeError,
    IncompatibleStateError,
    IndexFormatError,
    LoaderError,
    LoaderTimeoutError,
    ManifestError,
    OutputExistsError,
    PackError,
    SharedMemoryError,
    SpecError,
    StokerError,
    StokerFormatError,
    StorageError,
    TooManyBadSamplesError,
    TooManyRejectsError,
    WorkerDiedError,
    WorkerError,
)
from stoker._core.schema import Field, Schema
from stoker._core.specs import ArraySpec

__version__ = "0.1.0"

# name -> "module:attribute" (attribute empty for a submodule)
_LAZY: dict[str, str] = {
    "Loader": "stoker.loader:Loader",
    "Preempted": "stoker.loader:Preempted",
    "on_sigterm": "stoker.loader:on_sigterm",
    "cleanup_stale": "stoker.loader:cleanup_stale",
    "check_resume": "stoker.resume:check_resume",
    "convert": "stoker.pack:convert",
    "make_sample_data": "stoker.pack:make_sample_data",
    "PackReport": "stoker.pack:PackReport",
    "open_records": "stoker.formats.recordio:open_records",
    "pack": "stoker.pack:pack",
    "prefetch": "stoker.loader:prefetch",
    "sampling": "stoker.sampling:",
    "train": "stoker.train:",
    "transforms": "stoker.transforms:",
    "watch": "stoker.doctor:watch",
}

__all__ = sorted(["ArraySpec", "Field", "Schema", "__version__", *_errors.__all__, *_LAZY])


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'stoker' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return list(__all__)


if TYPE_CHECKING:  # pragma: no cover
    from stoker import sampling, train, transforms
    from stoker.doctor import watch
    from stoker.formats.recordio import open_records
    from stoker.loader import Loader, Preempted, cleanup_stale, on_sigterm, prefetch
    from stoker.pack import PackReport, convert, make_sample_data, pack
    from stoker.resume import check_resume
