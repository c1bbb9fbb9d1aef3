"""The sample schema: the named fields one sample carries, each of one kind.

A :class:`Schema` is an ordered set of named :class:`Field` objects. It lives in a packed set's
manifest (``"schema"``, see ``docs/format.md``), travels with a source to the loader, and says
what a batch holds beside the images (``docs/contracts.md``).

The kinds, and the value a sample gives for each (what ``Field.check`` accepts and returns):

============  ===========================================  =====================================
kind          what                                         one sample's value
============  ===========================================  =====================================
``image``     encoded image bytes, decoded by the pipeline  bytes (JPEG, PNG, ...)
``mask``      an encoded label map (PNG), decoded like an   bytes; decoded to uint8/uint16 (H, W)
              image, moved by geometry with nearest
              neighbour interpolation
``numeric``   a fixed-shape number or vector (a class,      ndarray of ``shape`` and ``dtype``
              multi-label targets)
``ragged``    a variable number of rows of a fixed shape    ndarray ``(n, *shape)`` of ``dtype``
              (boxes ``n x 4``, keypoints ``n x K x 3``,
              polygon points ``n x 2``)
``text``      a UTF-8 string (a caption, an OCR line)       str
``bytes``     opaque bytes                                  bytes
``size``      metadata: the stored image's (height,         (computed by the loader, not stored)
              width) before any transform
============  ===========================================  =====================================

``geometry`` (ragged fields only) says how transforms move the rows: ``"boxes"`` (rows of
``x1, y1, x2, y2`` in pixels of the stored image, continuous coordinates: pixel ``(r, c)``
covers ``[c, c+1) x [r, r+1)``), ``"points"`` (rows whose last axis starts ``x, y``; a third
value, when present, is a visibility flag: 0 means not visible), or ``None`` (not geometric:
classes, scores). ``follows`` (ragged only) names a ``boxes`` field whose rows these rows belong
to: when a transform drops a box, its rows here go with it.

``max_len`` (ragged, text, bytes) is the largest row count (or byte length) of one sample;
``stoker pack`` records it, and the loader sizes its batch columns from it.

``header`` (numeric only): RecordIO keeps this field in the record's ``IRHeader`` labels, where
MXNet reads it. At most one field has it. Everything else lives in the payload's field
trailer (``docs/format.md``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from stoker._core.errors import SpecError

__all__ = ["KINDS", "SIZE_FIELD", "Field", "Schema"]

KINDS = ("image", "mask", "numeric", "ragged", "text", "bytes", "size")
GEOMETRIES = ("boxes", "points")
#: The name under which the loader carries a sample's stored (height, width) when asked.
SIZE_FIELD = "size"
_NUMERIC_DTYPES = (
    "uint8",
    "int8",
    "uint16",
    "int16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
)
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]{0,63}\Z")
SCHEMA_VERSION = 1


#: the most values a field's shape may hold (a numeric field's whole value, a ragged field's
#: row): a batch column is allocated from it, so a manifest's shape is refused above this
#: rather than asked of the allocator
MAX_FIELD_VALUES = 1 << 24


def _fail(name: str, reason: str) -> SpecError:
    return SpecError(f"field {name!r}: {reason}")


@dataclass(frozen=True)
class Field:
    """One named part of a sample; see the module docstring. Build with the class methods
    (``Field.boxes()``, ``Field.text()``, ...) rather than by hand."""

    kind: str
    dtype: str = "uint8"
    shape: tuple[int, ...] = ()
    geometry: str | None = None
    follows: str | None = None
    max_len: int | None = None
    header: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecError(f"field kind must be one of {KINDS}, got {self.kind!r}")
        object.__setattr__(self, "dtype", np.dtype(self.dtype).name)
        shape = tuple(self.shape)
        if not all(
            isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in shape
        ):
            raise SpecError(f"a field's shape holds ints >= 1, got {self.shape!r}")
        if math.prod(int(d) for d in shape) > MAX_FIELD_VALUES:
            raise SpecError(
                f"a field's shape {tuple(int(d) for d in shape)} holds more than "
                f"{MAX_FIELD_VALUES} values (2^24) per sample or row"
            )
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if self.kind in ("numeric", "ragged"):
            if self.dtype not in _NUMERIC_DTYPES:
                raise SpecError(
                    f"a {self.kind} field's dtype must be one of {_NUMERIC_DTYPES}, got {self.dtype}"
                )
        elif self.kind == "size":
            object.__setattr__(self, "dtype", "int32")
            object.__setattr__(self, "shape", (2,))
        else:
            object.__setattr__(self, "dtype", "uint8")
            if self.shape:
                raise SpecError(f"a {self.kind} field has no shape, got {self.shape!r}")
        if self.geometry is not None:
            if self.kind != "ragged" or self.geometry not in GEOMETRIES:
                raise SpecError(
                    f"geometry {self.geometry!r}: only ragged fields have one, of {GEOMETRIES}"
                )
            if self.geometry == "boxes" and self.shape != (4,):
                raise SpecError(f"boxes have rows of shape (4,) (x1, y1, x2, y2), got {self.shape}")
            if self.geometry == "points" and (not self.shape or self.shape[-1] < 2):
                raise SpecError(f"points need a last axis of at least 2 (x, y), got {self.shape}")
            if self.dtype not in ("float32", "float64"):
                raise SpecError(f"geometric fields are float32 or float64, got {self.dtype}")
        if self.follows is not None and self.kind != "ragged":
            raise SpecError("only ragged fields can follow a boxes field")
        if self.max_len is not None:
            if self.kind not in ("ragged", "text", "bytes"):
                raise SpecError(f"max_len is for ragged, text and bytes fields, not {self.kind}")
            if (
                isinstance(self.max_len, bool)
                or not isinstance(self.max_len, (int, np.integer))
                or self.max_len < 0
            ):
                raise SpecError(f"max_len must be an int >= 0, got {self.max_len!r}")
            object.__setattr__(self, "max_len", int(self.max_len))
        if self.header and self.kind != "numeric":
            raise SpecError("only a numeric field can live in the IRHeader labels")

    # ------------------------------------------------------------------ constructors
    @classmethod
    def image(cls) -> Field:
        return cls("image")

    @classmethod
    def mask(cls) -> Field:
        return cls("mask")

    @classmethod
    def numeric(
        cls, shape: tuple[int, ...] = (), dtype: str = "float32", *, header: bool = False
    ) -> Field:
        return cls("numeric", dtype, tuple(shape), header=header)

    @classmethod
    def ragged(
        cls,
        shape: tuple[int, ...] = (),
        dtype: str = "float32",
        *,
        geometry: str | None = None,
        follows: str | None = None,
        max_len: int | None = None,
    ) -> Field:
        return cls(
            "ragged", dtype, tuple(shape), geometry=geometry, follows=follows, max_len=max_len
        )

    @classmethod
    def boxes(cls, *, max_len: int | None = None) -> Field:
        """``n x 4`` float32 boxes ``x1, y1, x2, y2`` in pixels."""
        return cls.ragged((4,), "float32", geometry="boxes", max_len=max_len)

    @classmethod
    def points(
        cls,
        shape: tuple[int, ...] = (2,),
        *,
        follows: str | None = None,
        max_len: int | None = None,
    ) -> Field:
        """``n x *shape`` float32 points, the last axis ``x, y[, visibility, ...]``."""
        return cls.ragged(
            tuple(shape), "float32", geometry="points", follows=follows, max_len=max_len
        )

    @classmethod
    def text(cls, *, max_len: int | None = None) -> Field:
        return cls("text", max_len=max_len)

    @classmethod
    def bytes_(cls, *, max_len: int | None = None) -> Field:
        return cls("bytes", max_len=max_len)

    @classmethod
    def size(cls) -> Field:
        return cls("size")

    # ------------------------------------------------------------------ values
    @property
    def variable(self) -> bool:
        """True for kinds whose length varies per sample (ragged, text, bytes)."""
        return self.kind in ("ragged", "text", "bytes")

    @property
    def encoded(self) -> bool:
        """True for kinds stored as encoded images (image, mask)."""
        return self.kind in ("image", "mask")

    def check(self, value: Any, *, name: str = "?") -> Any:
        """``value`` as this field stores it (see the module table), or ``SpecError`` naming
        the field. Lists become arrays; a ragged value with no rows may be ``[]``."""
        kind = self.kind
        if kind in ("image", "mask", "bytes"):
            if isinstance(value, str) or not isinstance(value, (bytes, bytearray, memoryview)):
                raise _fail(name, f"expects bytes, got {type(value).__name__}")
            value = bytes(value)
            if kind != "bytes" and not value:
                raise _fail(name, "an encoded image of 0 bytes")
            return value
        if kind == "text":
            if not isinstance(value, str):
                raise _fail(name, f"expects a str, got {type(value).__name__}")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 spelling
                raise _fail(
                    name,
                    f"text that is not valid Unicode (a lone surrogate at character {e.start})",
                ) from None
            return value
        if kind == "size":
            raise _fail(name, "size is computed by the loader, not stored")
        try:
            arr = np.asarray(
                value, dtype=np.float64 if kind == "ragged" and _empty(value) else None
            )
        except (TypeError, ValueError) as e:
            raise _fail(name, f"not numeric: {e}") from None
        if arr.dtype.kind not in "biuf":
            raise _fail(name, f"expects numbers, got {arr.dtype}")
        if kind == "ragged" and arr.size == 0:
            arr = arr.reshape((0, *self.shape))
        want = self.shape if kind == "numeric" else (None, *self.shape)
        if arr.ndim != len(want) or any(w is not None and w != a for w, a in zip(want, arr.shape)):
            shown = ", ".join("n" if w is None else str(w) for w in want)
            raise _fail(name, f"expects shape ({shown}), got {arr.shape}")
        if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
            raise _fail(name, "holds NaN or infinity")
        out = arr.astype(self.dtype)
        if (
            arr.dtype.kind == "f"
            and np.dtype(self.dtype).kind in "iu"
            and not np.array_equal(out, arr)
        ):
            raise _fail(name, f"expects whole numbers ({self.dtype}), got fractions")
        return out

    def length(self, value: Any) -> int:
        """Rows (ragged) or bytes (text as UTF-8, bytes) of a checked value."""
        if self.kind == "text":
            return len(value.encode("utf-8"))
        return len(value)

    def to_json(self, name: str) -> dict:
        d: dict[str, Any] = {"name": name, "kind": self.kind}
        if self.kind in ("numeric", "ragged"):
            d["dtype"] = self.dtype
            d["shape"] = list(self.shape)
        for key in ("geometry", "follows", "max_len"):
            v = getattr(self, key)
            if v is not None:
                d[key] = v
        if self.header:
            d["header"] = True
        return d


def _empty(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 0


@dataclass(frozen=True)
class Schema(Mapping[str, Field]):
    """An ordered, frozen mapping of field name to :class:`Field`, checked as a whole:
    exactly one ``image`` field, at most one ``header`` field, ``follows`` naming a boxes field.

    >>> s = Schema({"image": Field.image(), "label": Field.numeric((), "int64", header=True),
    ...             "boxes": Field.boxes(), "classes": Field.ragged((), "int64", follows="boxes")})
    >>> s.image_name, s.header_name, list(s.extra)
    ('image', 'label', ['boxes', 'classes'])
    """

    fields: tuple[tuple[str, Field], ...] = field(default=())

    def __init__(self, fields: Mapping[str, Field] | tuple[tuple[str, Field], ...] = ()) -> None:
        items = tuple(fields.items()) if isinstance(fields, Mapping) else tuple(fields)
        object.__setattr__(self, "fields", items)
        self._validate()

    def _validate(self) -> None:
        seen: dict[str, Field] = {}
        for name, f in self.fields:
            if not isinstance(name, str) or not _NAME_RE.match(name):
                raise SpecError(
                    f"field name {name!r}: letters, digits, _ . - / (up to 64), not starting with a digit"
                )
            if not isinstance(f, Field):
                raise SpecError(f"field {name!r}: expected a Field, got {type(f).__name__}")
            if name in seen:
                raise SpecError(f"field {name!r} is declared twice")
            seen[name] = f
        images = [n for n, f in self.fields if f.kind == "image"]
        if len(images) != 1:
            raise SpecError(f"a schema has exactly one image field, got {len(images)} ({images})")
        headers = [n for n, f in self.fields if f.header]
        if len(headers) > 1:
            raise SpecError(f"at most one field lives in the IRHeader labels, got {headers}")
        for n, f in self.fields:
            if f.kind == "size" and n != SIZE_FIELD:
                raise SpecError(f"the size field is named {SIZE_FIELD!r}, got {n!r}")
            if f.follows is not None:
                target = seen.get(f.follows)
                if target is None or target.geometry != "boxes":
                    raise SpecError(
                        f"field {n!r} follows {f.follows!r}, which is not a boxes field of this schema"
                    )

    # Mapping
    def __getitem__(self, name: str) -> Field:
        for n, f in self.fields:
            if n == name:
                return f
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (n for n, _ in self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __hash__(self) -> int:
        return hash(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fields == other.fields

    def __repr__(self) -> str:
        return "Schema({" + ", ".join(f"{n!r}: {f!r}" for n, f in self.fields) + "})"

    # ------------------------------------------------------------------ views
    @property
    def image_name(self) -> str:
        return next(n for n, f in self.fields if f.kind == "image")

    @property
    def header_name(self) -> str | None:
        return next((n for n, f in self.fields if f.header), None)

    @property
    def extra(self) -> dict[str, Field]:
        """The fields beyond the image and the header label: what the payload trailer holds
        (and ``size``, which nothing stores)."""
        return {n: f for n, f in self.fields if f.kind != "image" and not f.header}

    @property
    def stored(self) -> dict[str, Field]:
        """The fields the payload trailer holds, in trailer order."""
        return {n: f for n, f in self.extra.items() if f.kind != "size"}

    def select(self, names: list[str] | tuple[str, ...]) -> Schema:
        """The image, the header field and ``names`` (in schema order); ``"size"`` may be named
        even when the schema lacks it. Unknown names are a ``SpecError`` listing the known ones."""
        names = list(names)
        known = set(self) | {SIZE_FIELD}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SpecError(
                f"unknown fields {unknown}; this set has {list(self)} (and {SIZE_FIELD!r})"
            )
        keep = [(n, f) for n, f in self.fields if f.kind == "image" or f.header or n in names]
        kept_boxes = {n for n, f in keep if f.geometry == "boxes"}
        for n, f in keep:
            if f.follows is not None and f.follows not in kept_boxes:
                raise SpecError(f"field {n!r} follows {f.follows!r}; ask for {f.follows!r} too")
        if SIZE_FIELD in names and SIZE_FIELD not in self:
            keep.append((SIZE_FIELD, Field.size()))
        return Schema(tuple(keep))

    def with_max_len(self, lengths: Mapping[str, int]) -> Schema:
        """This schema with ``max_len`` set from ``lengths`` (name -> the largest seen)."""
        return Schema(
            tuple(
                (n, replace(f, max_len=int(lengths[n])) if n in lengths else f)
                for n, f in self.fields
            )
        )

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        return {"version": SCHEMA_VERSION, "fields": [f.to_json(n) for n, f in self.fields]}

    @classmethod
    def from_json(cls, d: Any, *, where: str = "schema") -> Schema:
        """Parse what ``to_json`` wrote; a ``SpecError`` names ``where`` and the entry."""
        if (
            not isinstance(d, dict)
            or d.get("version") != SCHEMA_VERSION
            or not isinstance(d.get("fields"), list)
        ):
            raise SpecError(f"{where}: expected {{'version': {SCHEMA_VERSION}, 'fields': [...]}}")
        out = []
        for i, e in enumerate(d["fields"]):
            if not isinstance(e, dict) or not isinstance(e.get("name"), str):
                raise SpecError(f"{where}: fields[{i}] must be an object with a name")
            allowed = {"name", "kind", "dtype", "shape", "geometry", "follows", "max_len", "header"}
            extra = set(e) - allowed
            if extra:
                raise SpecError(
                    f"{where}: fields[{i}] ({e['name']}) has unknown keys {sorted(extra)}"
                )
            try:
                f = Field(
                    kind=e.get("kind", ""),
                    dtype=e.get("dtype", "uint8"),
                    shape=tuple(e.get("shape", ())),
                    geometry=e.get("geometry"),
                    follows=e.get("follows"),
                    max_len=e.get("max_len"),
                    header=bool(e.get("header", False)),
                )
            except (SpecError, TypeError) as err:
                raise SpecError(f"{where}: fields[{i}] ({e['name']}): {err}") from None
            out.append((e["name"], f))
        try:
            return cls(tuple(out))
        except SpecError as err:
            raise SpecError(f"{where}: {err}") from None

    @classmethod
    def classification(
        cls, label_shape: tuple[int, ...] = (), label_dtype: str = "int64"
    ) -> Schema:
        """What every set without a declared schema is: an image and its IRHeader label(s)."""
        return cls(
            {
                "image": Field.image(),
                "label": Field.numeric(tuple(label_shape), label_dtype, header=True),
            }
        )


def nbytes(f: Field) -> int:
    """Bytes of one fixed value (numeric, size) or one ragged row."""
    return int(np.dtype(f.dtype).itemsize * math.prod(f.shape))
