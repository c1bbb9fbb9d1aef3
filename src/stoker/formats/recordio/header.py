"""The image-record header (``IRHeader``) at the front of every payload: packing and unpacking.

Payload (MXNet ``recordio.pack``): ``<IfQQ`` = flag (uint32), label (float32), id (uint64),
id2 (uint64), 24 bytes; when ``flag = N > 0`` the label field is 0 and ``N`` float32 labels
follow the header; the image bytes come last. The framing around a payload is in
``framing.py``; ``README.md`` in this folder shows both layouts.
"""

from __future__ import annotations

import numbers
import struct
from collections.abc import Callable
from dataclasses import dataclass
from math import isfinite
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "IR_FORMAT",
    "DECLARED_INT64",
    "INFERRED_INT64",
    "IR_SIZE",
    "IRHeader",
    "LabelKind",
    "inferred_kind",
    "label_problem",
    "whole_numbers",
    "pack_header",
    "pack_headers",
    "unpack_header",
]

IR_FORMAT = "<IfQQ"
IR_SIZE = struct.calcsize(IR_FORMAT)  # 24
_IR = struct.Struct(IR_FORMAT)
#: ``IR_FORMAT`` as a numpy record, for many headers at once
IR_DTYPE = np.dtype([("flag", "<u4"), ("label", "<f4"), ("id", "<u8"), ("id2", "<u8")])


class IRHeader(NamedTuple):
    """MXNet's image-record header. ``label`` is a float (``flag == 0``) or a float32 array
    of ``flag`` labels."""

    flag: int
    label: float | np.ndarray
    id: int
    id2: int


def pack_header(header: IRHeader | tuple, data: bytes | bytearray | memoryview = b"") -> bytes:
    """Header + labels + ``data`` as one dmlc payload (what ``mx.recordio.pack`` returns).

    A scalar label gives ``flag = 0``; a sequence or array of labels gives ``flag = N`` (the
    ``flag`` field passed in is ignored, as in MXNet).
    """
    flag, label, id_, id2 = header
    del flag
    if not (0 <= int(id_) < 1 << 64 and 0 <= int(id2) < 1 << 64):
        raise ValueError(f"IRHeader ids must fit uint64, got id={id_}, id2={id2}")
    if isinstance(label, numbers.Real):
        return _IR.pack(0, float(label), int(id_), int(id2)) + bytes(data)
    labels = np.ascontiguousarray(label, dtype="<f4").reshape(-1)
    if labels.size == 0 or labels.size > 0xFFFFFFFF:
        raise ValueError(f"a label array needs 1..2**32-1 values, got {labels.size}")
    return _IR.pack(labels.size, 0.0, int(id_), int(id2)) + labels.tobytes() + bytes(data)


def pack_headers(keys: np.ndarray, labels: np.ndarray) -> bytes | None:
    """The IRHeaders ``(0, labels[i], keys[i], 0)`` of many records, 24 bytes each, one after
    another: what :func:`pack_header` packs for each one-number label and key. ``None`` when
    a label is out of float32's range (:func:`pack_header` names it) or a key is not an
    integer in ``[0, 2**63)``."""
    keys = np.asarray(keys)
    values = np.asarray(labels).astype(np.float64)
    if keys.dtype.kind not in "iu" or keys.shape != values.shape or keys.ndim != 1:
        return None
    if keys.size and (int(keys.min()) < 0 or int(keys.max()) >= 1 << 63):
        return None
    with np.errstate(over="ignore"):
        narrow = values.astype("<f4")
    if not np.array_equal(np.isinf(narrow), np.isinf(values)):
        return None  # struct refuses a finite label that overflows float32
    out = np.zeros(keys.shape[0], dtype=IR_DTYPE)
    out["label"] = narrow
    out["id"] = keys
    return out.tobytes()


def unpack_header(buf: bytes | bytearray | memoryview) -> tuple[IRHeader, memoryview]:
    """``(IRHeader, image bytes)`` of a dmlc payload; the image is a view into ``buf``.

    Raises ``ValueError`` when ``buf`` is shorter than the header or than its ``flag``
    labels (callers that know the record's file and offset turn that into a
    ``CorruptRecordError``).
    """
    mv = memoryview(buf).cast("B")
    if len(mv) < IR_SIZE:
        raise ValueError(f"payload of {len(mv)} bytes is shorter than the 24-byte IRHeader")
    flag, label, id_, id2 = _IR.unpack_from(mv, 0)
    if flag == 0:
        return IRHeader(0, label, id_, id2), mv[IR_SIZE:]
    need = IR_SIZE + 4 * flag
    if need > len(mv):
        raise ValueError(
            f"IRHeader flag {flag} asks for {flag} float32 labels ({4 * flag} bytes) but only "
            f"{len(mv) - IR_SIZE} bytes follow the header"
        )
    labels = np.frombuffer(mv, dtype="<f4", count=flag, offset=IR_SIZE).astype(np.float32)
    return IRHeader(flag, labels, id_, id2), mv[need:]


#: Why a set's labels must be whole numbers: its manifest says so, or (a set without one)
#: :func:`inferred_kind` found them so (with what to do about a float label set).
DECLARED_INT64 = "the manifest declares int64 labels"
INFERRED_INT64 = (
    "the set has no manifest and most of its labels are whole numbers, so they are int64 "
    "class ids; a manifest's schema declares float labels"
)


def whole_numbers(labels: np.ndarray) -> np.ndarray:
    """Which ``labels`` are whole numbers within int64 (NaN and infinity are not)."""
    arr = np.asarray(labels, dtype=np.float64)
    return np.asarray(np.isfinite(arr) & (arr == np.round(arr)) & (np.abs(arr) < 2.0**63))


def inferred_kind(labels: np.ndarray) -> str:
    """The label dtype of a set without a manifest, from every one-number label: ``int64``
    (class ids) when most of the finite ones are whole numbers within int64, else
    ``float32``. A label that does not fit (2.5 or 1e30 among class ids, NaN anywhere) is a
    corrupt record (:func:`label_problem`), never a reason to change the set's kind."""
    if labels.ndim != 1:
        return "float32"
    finite = int(np.isfinite(labels).sum())
    return "int64" if 2 * int(whole_numbers(labels).sum()) > finite else "float32"


def label_problem(header: IRHeader, classes: int = 0, *, whole: str = "") -> str | None:
    """What is wrong with a record's label(s), or ``None``: a label that is NaN or infinite
    (never a label); in a set whose manifest names ``classes`` classes, a one-label record
    whose label is not one of their ids (a whole number in ``0..classes-1``); where the labels
    are int64 (``whole``: why, :data:`DECLARED_INT64` or :data:`INFERRED_INT64`), a label that
    is not a whole number within int64."""
    label = header.label
    if not np.all(np.isfinite(label)):
        return f"the IRHeader label {label} is not a finite number"
    if whole and not (classes and header.flag == 0):
        if not np.all(whole_numbers(np.asarray(label))):
            return f"the IRHeader label {label} is not a whole number within int64 ({whole})"
    if classes and header.flag == 0:
        v = float(label)  # type: ignore[arg-type]
        if not (v.is_integer() and 0 <= v < classes):
            return (
                f"the IRHeader label {v!r} is not a class id (the manifest names {classes}: "
                f"0..{classes - 1})"
            )
    return None


@dataclass(frozen=True)
class LabelKind:
    """What a set's label is, decided once in the process that opens the set and sent to its
    workers, which read each label from the header they parse (never the label array):
    ``shape`` and ``dtype`` of one label, ``classes`` (class ids a one-number int64 label must
    be one of; 0: any) and ``whole`` (why labels must be whole numbers; "": they need not)."""

    shape: tuple[int, ...]
    dtype: str
    classes: int = 0
    whole: str = ""

    def problem(self, header: IRHeader) -> str | None:
        """:func:`label_problem` of ``header`` in this set."""
        return label_problem(header, self.classes, whole=self.whole)

    def of(self, header: IRHeader) -> Any:
        """The label of a (checked) ``header``, as the set's labels hold it."""
        if self.shape:
            return np.asarray(header.label, self.dtype).reshape(self.shape)
        return self.scalar(header.label)  # type: ignore[arg-type]

    @property
    def scalar(self) -> Callable[[float], Any]:
        """A one-number label's conversion to the label dtype."""
        return int if self.dtype == "int64" else np.float32

    def fast(self) -> Callable[[float], bool] | None:
        """The fast path's one test of a one-float label (``None``: the label is not one
        number): finite, and where labels are int64 a whole number within int64 (or one of
        the class ids). A label that fails goes the slow way, where :meth:`problem` names it."""
        if self.shape:
            return None
        if not self.whole:
            return isfinite
        if self.classes:
            hi = float(self.classes)
            return lambda v: 0.0 <= v < hi and v.is_integer()  # NaN and inf compare False
        return lambda v: -(2.0**63) < v < 2.0**63 and v.is_integer()
