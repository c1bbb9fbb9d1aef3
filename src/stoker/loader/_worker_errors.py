"""A worker's exception, carried to the main process as plain data and raised there again.

A worker turns an exception into a JSON-safe dict (:func:`error_info`: type, message,
traceback text, and the sample's key, index and place); main turns that dict back into an
exception (:func:`rebuild`) that is a :class:`WorkerError` and, when the original type can be
imported and subclassed, also an instance of that type, so ``except ValueError`` still catches
a worker's ``ValueError``.
"""

from __future__ import annotations

import contextlib
import importlib
import traceback
from typing import Any

from stoker._core.errors import ImageDecodeError, WorkerError, with_child_traceback
from stoker.loader.sources import Source

__all__ = ["error_info", "rebuild"]

_hybrids: dict[type, type] = {}  # original type -> its WorkerError hybrid (or WorkerError)


def error_info(e: BaseException, source: Source, index: int) -> dict:
    """``e``, raised on sample ``index`` of ``source``, as the dict a worker reports."""
    try:
        key: int | None = int(source.key(index))
    except Exception:  # noqa: BLE001
        key = None
    try:
        where = source.describe(index)
    except Exception:  # noqa: BLE001
        where = f"position {index}"
    return {
        "module": type(e).__module__,
        "qualname": type(e).__qualname__,
        "message": str(e),
        "traceback": "".join(traceback.format_exception(type(e), e, e.__traceback__)),
        "key": key,
        "index": int(index),
        "where": where,
        "attrs": _plain_attrs(e),
    }


def _plain_attrs(e: BaseException) -> dict:
    """The exception's own public attributes that are plain values (a ``CorruptRecordError``'s
    ``path``, ``offset``, ``idx_line``, ``reason``), so the rebuilt error keeps them."""
    try:
        items = vars(e).items()
    except TypeError:
        return {}
    return {
        k: v
        for k, v in items
        if not k.startswith("_") and (v is None or isinstance(v, (str, int, float, bool)))
    }


def _original_type(info: dict) -> type | None:
    try:
        obj: Any = importlib.import_module(info["module"])
        for part in info["qualname"].split("."):
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001
        return None
    return obj if isinstance(obj, type) and issubclass(obj, Exception) else None


def _hybrid(exc_type: type, msg: str, kwargs: dict) -> type:
    """A subclass of both ``WorkerError`` and ``exc_type`` (made once per type), or
    ``WorkerError`` when the two cannot be combined."""
    cls = _hybrids.get(exc_type)
    if cls is not None:
        return cls
    try:
        cls = type(
            f"Worker{exc_type.__name__}",
            (WorkerError, exc_type),
            {"__init__": _init_hybrid, "__str__": WorkerError.__str__, "__module__": __name__},
        )
        cls(msg, **kwargs)
    except Exception:  # noqa: BLE001 - e.g. a layout conflict between the bases
        cls = WorkerError
    _hybrids[exc_type] = cls
    return cls


def rebuild(info: dict, worker_id: int | None) -> WorkerError:
    """The exception to raise in main for a worker's ``info`` (``worker_id`` None: workers=0)."""
    exc_type = _original_type(info)
    who = "main process (workers=0)" if worker_id is None else f"worker {worker_id}"
    msg = f"{who} failed on {info['where']}: {info['qualname']}: {info['message']}"
    kwargs = dict(
        exc_type=info["qualname"],
        worker_id=worker_id,
        key=info["key"],
        index=info["index"],
        remote_traceback=info["traceback"],
    )
    cls: type = WorkerError
    if exc_type is not None and not issubclass(exc_type, WorkerError):
        if issubclass(exc_type, ImageDecodeError):  # bad data: what to do about it
            msg += '; on_error="skip" leaves bad samples out; stoker pack (a folder) or stoker '
            msg += "verify --decode (a packed set) lists every one"
        cls = _hybrid(exc_type, msg, kwargs)
    try:
        err = cls(msg, **kwargs)
    except Exception:  # noqa: BLE001
        err = WorkerError(msg, **kwargs)
    if isinstance(err, ImageDecodeError) and exc_type is not None:
        with contextlib.suppress(Exception):  # the cause, without the worker's frames
            err.__cause__ = exc_type(info["message"])
    for name, value in info.get("attrs", {}).items():
        if name not in kwargs and not hasattr(WorkerError, name):
            try:
                setattr(err, name, value)
            except AttributeError:  # a read-only property of the original type
                pass
    return err


def _init_hybrid(self: Any, message: str, **kwargs: Any) -> None:
    """``__init__`` of the hybrids: the original type's own ``__init__`` may want other
    arguments, so only the message goes to ``Exception``."""
    self.exc_type = kwargs.get("exc_type", "Exception")
    self.worker_id = kwargs.get("worker_id")
    self.key = kwargs.get("key")
    self.index = kwargs.get("index")
    self.remote_traceback = kwargs.get("remote_traceback", "")
    with_child_traceback(self, self.remote_traceback)
    Exception.__init__(self, message)
