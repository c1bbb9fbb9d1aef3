"""Read a listing (``.jsonl`` or ``.csv``): one sample per row, an image path plus its fields.

The rules (``docs/pack.md`` has them with an example):

- ``image`` (or ``path``): the image file, relative to the listing's folder (or ``root``);
- ``label``: the class, stored in the IRHeader where MXNet reads it: an int, a number, or a
  class name (names get ids 0..C-1 in sorted order, as folder classes do); a list of numbers
  of the same length in every row is a label vector (float32, the IRHeader's several labels,
  as an im2rec list with several label columns gives);
- a str under a key ending in ``mask``: the path of a mask PNG (palette or grey);
- any other str: text;
- a number: a numeric scalar; a list of numbers of the same length in every row: a numeric
  vector (int64 when every value is whole, else float32);
- a list of lists: a ragged field, its rows of the shape of the inner lists; geometry
  ``boxes`` when the key is ``boxes``/``bbox`` or ends in ``_boxes`` and the rows hold 4
  numbers, ``points`` when the key contains ``points`` (``keypoints`` too); an empty list is
  a ragged field with no rows;
- a list of numbers whose length differs between rows is ragged with scalar rows; a ragged
  field that is not geometric and has as many rows as the one boxes field in every row
  follows it (its rows are dropped with their boxes);
- CSV: a cell holding a list is JSON text; a column whose every cell is a number is numeric.

A ``schema`` given to :func:`read_listing` replaces the inference (its ``bytes`` fields take
base64 text). Every row is checked with ``Field.check``; a row that fails (a missing key, a
value of the wrong shape, a JSON line that does not parse) is a reject naming the line and
the field, as a folder's unreadable files are.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._core.errors import PackError, SpecError
from stoker._core.files import Item, ScanResult
from stoker._core.jsondoc import unique_keys
from stoker._core.schema import Field, Schema
from stoker.pack.plan.scan import _Confine

__all__ = [
    "LISTING_SUFFIXES",
    "ListingItem",
    "infer_schema",
    "is_listing",
    "max_lengths",
    "read_listing",
]

LISTING_SUFFIXES = (".jsonl", ".csv")
_IMAGE_KEYS = ("image", "path")
_LABEL_KEY = "label"

Row = tuple[int, dict[str, Any]]  # (1-based line, the row's values)


@dataclass(frozen=True)
class ListingItem(Item):
    """An :class:`Item` of a listing: ``fields`` holds the checked values of the stored fields
    but masks, ``masks`` the ``(field, path)`` of each mask, read by a worker."""

    fields: dict[str, Any] = field(default_factory=dict, compare=False)
    masks: tuple[tuple[str, str], ...] = ()
    line: int = 0


def is_listing(path: str) -> bool:
    return path.lower().endswith(LISTING_SUFFIXES)


# ---------------------------------------------------------------- parsing rows
#: the deepest nesting of lists and objects a row may hold (a ragged field of shape
#: ``(n, a, b)`` needs 4 inside its row's object); deeper is a reject, found before ``json``
#: would recurse into it
MAX_DEPTH = 32


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


def _maybe_too_deep(text: str) -> bool:
    """False when the JSON ``text`` surely nests no deeper than :data:`MAX_DEPTH`: its
    brackets outside strings, with the innermost pairs taken away once per level (each pass
    in C, as many passes as the nesting is deep), are gone within that many passes, and
    fewer openers than the rest of the allowance are left unpaired."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    passes = 0
    while passes < MAX_DEPTH:
        fewer = _INNERMOST.sub("", brackets)
        if fewer == brackets:
            break
        brackets, passes = fewer, passes + 1
    # what is left is unpaired (an unclosed bracket still nests what follows it)
    return passes + brackets.count("[") + brackets.count("{") > MAX_DEPTH


def _too_deep(text: str) -> str | None:
    """When the JSON ``text`` nests lists and objects deeper than :data:`MAX_DEPTH`: the key
    of the top-level object it does so under (``""`` when under none), else ``None``. Only
    text that :func:`_maybe_too_deep` suspects is scanned character by character."""
    if not _maybe_too_deep(text):
        return None
    depth = 0
    key = last = ""
    in_str = escaped = False
    start = 0
    for i, c in enumerate(text):
        if in_str:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_str = False
                last = text[start : i + 1]
        elif c == '"':
            in_str, start = True, i
        elif c == ":" and depth == 1:
            try:
                key = str(json.loads(last))
            except ValueError:
                key = last
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return key
        elif c in "]}":
            depth -= 1
    return None


class _Deep(Exception):
    """A CSV cell nests deeper than :data:`MAX_DEPTH`."""


def _deep_detail(lineno: int, key: str) -> str:
    field = f", field {key!r}" if key else ""
    return f"line {lineno}{field}: lists and objects nested deeper than {MAX_DEPTH} levels"


def _bad_text(row: dict[str, Any]) -> tuple[str, str] | None:
    """``(key, detail)`` of the first str in ``row`` (a key or a value, at any depth) that is
    not valid Unicode: a lone surrogate, which JSON's ``\\ud800`` escapes can give and which
    cannot be stored as UTF-8."""
    for top, v in row.items():
        stack: list[Any] = [top, v]
        while stack:
            x = stack.pop()
            if isinstance(x, list):
                stack.extend(x)
            elif isinstance(x, dict):
                stack.extend(x.keys())
                stack.extend(x.values())
            elif isinstance(x, str):
                try:
                    x.encode("utf-8")
                except UnicodeEncodeError as e:
                    return (
                        top.encode("utf-8", "backslashreplace").decode(),
                        f"text that is not valid Unicode (a lone surrogate "
                        f"{x[e.start]!a} at character {e.start} of {x!a})",
                    )
    return None


def _row_problem(lineno: int, row: dict[str, Any], raw: str) -> tuple[str, str, str] | None:
    """The reject of a parsed row whose text cannot be stored, else ``None``."""
    if "\\u" not in raw:  # a lone surrogate comes only from an escape
        return None
    bad = _bad_text(row)
    if bad is None:
        return None
    return f"line {lineno}", "bad_field", f"line {lineno}, field {bad[0]!r}: {bad[1]}"


def _jsonl_rows(text: str, path: str, rejects: list) -> list[Row]:
    rows = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        deep = _too_deep(line)
        if deep is not None:
            rejects.append((f"line {lineno}", "bad_field", _deep_detail(lineno, deep)))
            continue
        try:
            row = json.loads(line, object_pairs_hook=unique_keys)
        except ValueError as e:
            rejects.append((f"line {lineno}", "bad_row", f"line {lineno}: not JSON: {e}"))
            continue
        if not isinstance(row, dict):
            rejects.append(
                (f"line {lineno}", "bad_row", f"line {lineno}: not a JSON object {{...}}")
            )
            continue
        bad = _row_problem(lineno, row, line)
        if bad is not None:
            rejects.append(bad)
            continue
        rows.append((lineno, row))
    return rows


def _number(s: str) -> int | float | None:
    """The number a CSV cell spells, or ``None``. ``nan`` and ``inf`` are numbers here, so
    that their column stays numeric and the row check refuses the value, naming the line."""
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        return None


def _numeric_columns(header: list[str], raw: list[tuple[int, list[str]]]) -> set[str]:
    """The columns read as numbers: every cell a number (but ``image``/``path``), or, for the
    label, the kind most cells give (as a JSON listing's label): its other cells stay str
    and are refused as rows of another kind."""
    numeric = set()
    for j, name in enumerate(header):
        cells = [c[j] for _, c in raw if j < len(c)]
        if name in _IMAGE_KEYS or not cells:
            continue
        values = [_number(c) for c in cells]
        if all(v is not None for v in values):
            numeric.add(name)
        elif name == _LABEL_KEY:
            typical = _typical([c if v is None else v for c, v in zip(cells, values)])
            if not isinstance(typical, str):
                numeric.add(name)
    return numeric


def _csv_rows(text: str, path: str, rejects: list) -> list[Row]:
    """Rows of a CSV with a header line: list cells parsed as JSON, and numbers where a whole
    column (but ``image``/``path``) is numbers."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise PackError(f"{path}: empty CSV listing (a header line is needed)") from None
    except csv.Error as e:
        raise PackError(f"{path}, line 1: {e}") from None
    if len(set(header)) != len(header) or not all(header):
        raise PackError(f"{path}, line 1: column names must be distinct and non-empty: {header}")
    raw: list[tuple[int, list[str]]] = []
    try:
        for cells in reader:
            if cells and any(c.strip() for c in cells):
                raw.append((reader.line_num, cells))
    except csv.Error as e:
        raise PackError(f"{path}, line {reader.line_num}: {e}") from None
    numeric = _numeric_columns(header, raw)
    rows = []
    for lineno, cells in raw:
        if len(cells) != len(header):
            rejects.append(
                (
                    f"line {lineno}",
                    "bad_row",
                    f"line {lineno}: {len(cells)} cells, the header has {len(header)}",
                )
            )
            continue
        row: dict[str, Any] = {}
        try:
            for name, cell in zip(header, cells, strict=True):
                if cell.lstrip().startswith("["):
                    if _too_deep(cell) is not None:
                        raise _Deep
                    row[name] = json.loads(cell, object_pairs_hook=unique_keys)
                elif name in numeric:
                    v = _number(cell)
                    row[name] = cell if v is None else v
                else:
                    row[name] = cell
        except _Deep:
            rejects.append((f"line {lineno}", "bad_field", _deep_detail(lineno, name)))
            continue
        except ValueError as e:
            rejects.append(
                (f"line {lineno}", "bad_row", f"line {lineno}, field {name!r}: not JSON: {e}")
            )
            continue
        bad = _row_problem(lineno, row, "".join(cells))
        if bad is not None:
            rejects.append(bad)
            continue
        rows.append((lineno, row))
    return rows


# ---------------------------------------------------------------- inference
def _depth(v: Any) -> int:
    d = 0
    while isinstance(v, list):
        if not v:
            return d + 1
        v, d = v[0], d + 1
    return d


def _inner_shape(v: list) -> tuple[int, ...]:
    """The shape of one row of a list of lists (``[[1, 2], [3, 4]]`` -> ``(2,)``)."""
    shape = []
    x = v[0]
    while isinstance(x, list):
        shape.append(len(x))
        if not x:
            break
        x = x[0]
    return tuple(shape)


def _all_ints(values: list[Any]) -> bool:
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, bool) or not isinstance(v, int):
            return False
    return True


def _is_boxes(name: str) -> bool:
    low = name.lower()
    return low in ("boxes", "bbox") or low.endswith("_boxes")


def _signature(v: Any) -> tuple:
    """What kind of value ``v`` is, for choosing the typical value of a key."""
    if isinstance(v, list):
        if not v:
            return ("empty",)
        return ("flat",) if _depth(v) == 1 else ("nested", _inner_shape(v))
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        return ("other", type(v).__name__)
    return ("str",) if isinstance(v, str) else ("number",)


def _typical(values: list[Any]) -> Any:
    """The first value of the kind most rows have (empty lists count only when all are);
    rows of another kind are then rejected by ``Field.check``, naming their line."""
    sigs = [_signature(v) for v in values]
    counts: dict[tuple, int] = {}
    for sig in sigs:
        if sig != ("empty",):
            counts[sig] = counts.get(sig, 0) + 1
    if not counts:
        return values[0]
    best = max(counts.values())
    want = next(sig for sig in sigs if counts.get(sig) == best)
    return values[sigs.index(want)]


def _infer_one(name: str, values: list[Any], boxes_rows: list[int] | None) -> Field:
    """The field of key ``name`` from its values in every row that has it."""
    first = _typical(values)
    if isinstance(first, str):
        return Field.mask() if name.lower().endswith("mask") else Field.text()
    dtype = "int64" if _all_ints(values) else "float32"
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        return Field.numeric((), dtype)
    if not isinstance(first, list):
        raise SpecError(f"field {name!r}: cannot store a {type(first).__name__}")
    if _depth(first) == 1 and first:  # a flat list of numbers
        lengths = [len(v) for v in values if isinstance(v, list)]
        if len(set(lengths)) == 1 and lengths != boxes_rows:
            return Field.numeric((lengths[0],), dtype)
        return Field.ragged((), dtype)  # follows the boxes when its counts are theirs
    if not first:
        return Field.ragged((), "float32")
    shape = _inner_shape(first)
    if _is_boxes(name) and shape == (4,):
        return Field.boxes()
    if "points" in name.lower() and shape and shape[-1] >= 2:
        return Field.points(shape)
    return Field.ragged(shape, dtype)


def _classes(labels: list[Any]) -> dict[str, int] | None:
    """The class map when the labels are class names, the kind most rows give (a row of the
    other kind is then a reject): names get ids ``0..C-1`` in sorted order; else ``None``."""
    if not labels or not isinstance(_typical(labels), str):
        return None
    names = sorted({v for v in labels if isinstance(v, str)})
    return {n: i for i, n in enumerate(names)}


def infer_schema(rows: list[Row]) -> tuple[Schema, dict[str, int] | None]:
    """The schema of listing ``rows`` by the module's rules, and the class map when the labels
    are class names (else ``None``)."""
    keys: dict[str, list[Any]] = {}
    for _, row in rows:
        for k, v in row.items():
            keys.setdefault(k, []).append(v)
    image_key = next((k for k in _IMAGE_KEYS if k in keys), None)
    if image_key is None:
        raise PackError("the listing has no 'image' (or 'path') key naming each image")
    fields: list[tuple[str, Field]] = [("image", Field.image())]
    classes = None
    labels = keys.get(_LABEL_KEY)
    if labels is not None and isinstance(_typical(labels), list):  # several labels: a vector
        width = max(1, len(_typical(labels)))
        fields.append((_LABEL_KEY, Field.numeric((width,), "float32", header=True)))
    elif labels is not None:
        classes = _classes(labels)
        # a non-finite label is a reject of its own; it does not make the others float32
        numbers = [
            v
            for v in labels
            if not isinstance(v, str) and not (isinstance(v, float) and not math.isfinite(v))
        ]
        dtype = "int64" if classes or _all_ints(numbers) else "float32"
        fields.append((_LABEL_KEY, Field.numeric((), dtype, header=True)))
    extra = {k: v for k, v in keys.items() if k not in (*_IMAGE_KEYS, _LABEL_KEY)}
    boxes = [
        k
        for k, vs in extra.items()
        if _is_boxes(k) and any(isinstance(v, list) and v and _inner_shape(v) == (4,) for v in vs)
    ]
    the_boxes = boxes[0] if len(boxes) == 1 else None

    def counts(k: str) -> list[int]:
        """Row counts of ``k`` in the rows where it and the boxes field are both lists."""
        return [
            len(row[k])
            for _, row in rows
            if isinstance(row.get(k), list) and isinstance(row.get(the_boxes or ""), list)
        ]

    boxes_rows = counts(the_boxes) if the_boxes is not None else None
    for k, vs in extra.items():
        f = _infer_one(k, vs, boxes_rows if k != the_boxes else None)
        if (
            the_boxes is not None
            and k != the_boxes
            and f.kind == "ragged"
            and f.geometry is None
            and counts(k) == boxes_rows
        ):
            f = Field.ragged(f.shape, f.dtype, follows=the_boxes)
        fields.append((k, f))
    return Schema(tuple(fields)), classes


# ---------------------------------------------------------------- checking rows
def _value(f: Field, name: str, v: Any) -> Any:
    if f.kind == "bytes" and isinstance(v, str):
        try:
            v = base64.b64decode(v, validate=True)
        except (binascii.Error, ValueError) as e:
            raise SpecError(f"field {name!r}: not base64 text: {e}") from None
    return f.check(v, name=name)


def _label(v: Any, classes: dict[str, int] | None, header: Field) -> float | tuple[float, ...]:
    if header.shape:  # several labels (multi-label targets): stored as the IRHeader's vector
        return tuple(float(x) for x in header.check(v, name="label").reshape(-1).tolist())
    if classes is not None:  # class names: most rows give one, so every label must be one
        if not isinstance(v, str) or v not in classes:
            raise SpecError(
                f"field 'label': expects a class name as most rows give ({len(classes)} "
                f"known), got {v!r}"
            )
        return float(classes[v])
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SpecError(f"field 'label': expects a number as most rows give, got {v!r}")
    if not math.isfinite(v):
        raise SpecError(f"field 'label': expects a finite number, got {v!r}")
    if header.dtype == "int64":
        if v != int(v):
            raise SpecError(f"field 'label': expects a whole class id, got {v!r}")
        if not -(1 << 63) <= v < 1 << 63:
            raise SpecError(f"field 'label': the class id {v!r} is outside int64")
    return float(v)


def _item(
    lineno: int,
    row: dict[str, Any],
    schema: Schema,
    classes: dict[str, int] | None,
    base: str,
    confine: _Confine,
) -> ListingItem | tuple[str, str, str]:
    """The item of one row, or ``(rel, reason, detail)`` naming the line and the field."""
    image_name = schema.image_name
    rel = row.get(image_name, row.get("path") if image_name == "image" else None)
    where = f"line {lineno}"
    if not isinstance(rel, str) or not rel:
        return where, "bad_field", f"{where}, field {image_name!r}: expects an image path"
    head = schema.header_name
    label: float | tuple[float, ...] = 0.0
    values: dict[str, Any] = {}
    masks: list[tuple[str, str]] = []
    try:
        if head is not None:
            if head not in row:
                raise SpecError(f"field {head!r}: missing")
            label = _label(row[head], classes, schema[head])
        for name, f in schema.stored.items():
            if name not in row:
                raise SpecError(f"field {name!r}: missing")
            v = row[name]
            if f.kind == "mask":
                if not isinstance(v, str) or not v:
                    raise SpecError(f"field {name!r}: expects the path of a mask PNG")
                full = os.path.join(base, v)
                why = confine.reject(v, full)
                if why is not None:
                    raise SpecError(f"field {name!r}: {v!r}: {why[0]}: {why[1]}")
                masks.append((name, full))
            else:
                values[name] = _value(f, name, v)
    except SpecError as e:
        return rel, "bad_field", f"{where}, {e}"
    full = os.path.join(base, rel)
    why = confine.reject(rel, full)
    if why is not None:
        named = image_name if image_name in row else "path"  # the key the row gave it under
        return rel, why[0], f"{where}, field {named!r}: {why[1]}"
    return ListingItem(full, rel, label, None, values, tuple(masks), lineno)


def read_listing(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    allow_outside_root: bool = False,
    schema: Schema | None = None,
) -> tuple[ScanResult, Schema]:
    """The items of a ``.jsonl``/``.csv`` listing (rejects named by line and field) and its
    schema (``schema``, or inferred by the module's rules). Paths, masks' included, are read
    as an im2rec list's are (:func:`~stoker.pack.plan.scan.read_lst`)."""
    path = os.fspath(path)
    base = os.fspath(root) if root is not None else os.path.dirname(os.path.abspath(path))
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8-sig")
    except OSError as e:
        raise PackError(f"{path}: cannot read the listing: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise PackError(f"{path}: not UTF-8 text (byte {e.start})") from None
    res = ScanResult(items=[], classes={})
    parse = _csv_rows if path.lower().endswith(".csv") else _jsonl_rows
    rows = parse(text, path, res.rejects)
    if not rows:
        raise PackError(f"{path}: the listing has no rows")
    classes = None
    try:
        if schema is None:
            schema, classes = infer_schema(rows)
        elif schema.header_name is not None and not schema[schema.header_name].shape:
            classes = _classes([r[schema.header_name] for _, r in rows if schema.header_name in r])
    except SpecError as e:
        raise PackError(f"{path}: {e}") from None
    res.classes = dict(classes or {})
    confine = _Confine(base, root, allow_outside_root)
    res.found = len(rows) + len(res.rejects)
    for lineno, row in rows:
        got = _item(lineno, row, schema, classes, base, confine)
        if isinstance(got, tuple):
            res.rejects.append(got)
        else:
            res.items.append(got)
    return res, schema


def max_lengths(schema: Schema, items: Sequence[Item], written: np.ndarray) -> dict[str, int]:
    """The largest row count (ragged) or byte length (text, bytes) of each variable field over
    the records written: the schema's ``max_len``, which the loader sizes its columns by."""
    out = {n: 0 for n, f in schema.stored.items() if f.variable}
    for pos in np.flatnonzero(written).tolist():
        it = items[pos]
        if isinstance(it, ListingItem):
            for n in out:
                out[n] = max(out[n], schema[n].length(it.fields[n]))
    return out
