"""Which Example features become which sample fields, and their values.

A :class:`FeaturePlan` lists ``(field name, feature name, Field or None)``; ``None`` means
"infer the field from the first record" (a bare ``.tfrecord``), a ``Field`` is declared (a
stoker-written set's manifest, or the caller). :func:`resolve` turns a plan and the first
record into the set's :class:`Schema`; :func:`field_value` reads one field of one record.

Roles, decided by the field:

- the image field: a ``bytes`` feature with one non-empty value;
- the header (label) field: an ``int64`` or ``float`` feature of ``prod(shape)`` values; a bare
  file's label is the type and count most of its records hold (:func:`settle_label`), and a
  file where no record has the label feature is unlabelled (every label ``-1``);
- a ``boxes`` field: four ``float`` features ``PREFIX/xmin``, ``/ymin``, ``/xmax``, ``/ymax``
  normalised to 0..1 (the TF object-detection convention); read as pixel boxes
  ``x1 = xmin * width`` ... with the width and height from the image's own header;
- other ragged fields: a flat ``int64``/``float`` list of ``n * prod(shape)`` values; numeric:
  exactly ``prod(shape)`` values; ``text``/``bytes``/``mask``: a ``bytes`` feature, one value.

A variable field (ragged, text, bytes) missing from a record is empty (detection records
without objects often leave the lists out); any other field missing is an error.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from stoker._core.schema import Field, Schema
from stoker.formats.protowire import WireError
from stoker.formats.tfrecord.example import (
    RawFeature,
    bytes_values,
    float_values,
    int64_values,
    parse_features,
    value_count,
)
from stoker.formats.tfrecord.framing import FrameError, read_frame

__all__ = [
    "BOX_SUFFIXES",
    "manifest_plan",
    "settle_label",
    "FeaturePlan",
    "FieldError",
    "Resolved",
    "default_plan",
    "field_value",
    "image_hw",
    "resolve",
    "wanted_features",
]

BOX_SUFFIXES = ("/xmin", "/ymin", "/xmax", "/ymax")
IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
BOXES_KEY = "image/object/bbox"
CLASSES_KEY = "image/object/class/label"
#: The feature a stoker-written record keeps its key in (int64).
KEY_FEATURE = "stoker/key"


class FieldError(ValueError):
    """A feature that is not what its field needs; ``pos`` is the byte position in the
    record's data (``None`` when the feature is missing), ``field`` the field's name."""

    def __init__(self, field: str, reason: str, pos: int | None = None) -> None:
        super().__init__(f"field {field!r}: {reason}")
        self.field, self.reason, self.pos = field, reason, pos

    @classmethod
    def from_check(cls, field: str, err: Exception) -> FieldError:
        """``Field.check``'s refusal of ``field``, without naming the field twice."""
        return cls(field, str(err).removeprefix(f"field {field!r}: "))


@dataclass(frozen=True)
class FeaturePlan:
    """What to read: ``entries`` of ``(field name, feature, Field or None)``, in schema order
    (the image first, the label second); ``auto``: the fields that are left out when the
    first record lacks their feature (the label, the detection features of the defaults)."""

    entries: tuple[tuple[str, str, Field | None], ...]
    auto: frozenset[str] = frozenset()
    key_feature: str = KEY_FEATURE

    def feature_names(self) -> dict[str, str]:
        return {name: feat for name, feat, _ in self.entries}


def default_plan(
    *,
    image_key: str = IMAGE_KEY,
    label_key: str | None = LABEL_KEY,
    boxes_key: str | None = BOXES_KEY,
    classes_key: str | None = CLASSES_KEY,
    features: dict[str, Any] | None = None,
) -> FeaturePlan:
    """The plan of a bare TFRecord file: ``image``, ``label``, ``boxes`` and ``classes`` from
    the usual features (``None`` turns one off), plus ``features`` ``{field name: feature
    name}`` or ``{field name: (feature name, Field)}``."""
    entries: list[tuple[str, str, Field | None]] = [("image", image_key, Field.image())]
    auto = set()
    for name, feat in (("label", label_key), ("boxes", boxes_key), ("classes", classes_key)):
        if feat is not None:
            entries.append((name, feat, None))
            auto.add(name)
    for name, spec in (features or {}).items():
        feat, declared = (spec, None) if isinstance(spec, str) else tuple(spec)
        if not isinstance(feat, str) or not (declared is None or isinstance(declared, Field)):
            raise TypeError(
                f"features[{name!r}] must be a feature name or (feature name, Field), got {spec!r}"
            )
        if declared is not None and declared.kind in ("image", "size"):
            raise ValueError(f"features[{name!r}]: a {declared.kind} field cannot be added")
        if declared is not None and declared.geometry is not None:
            raise ValueError(
                f"features[{name!r}]: boxes come from boxes_key= (the four bbox features); "
                "points are not read from TFRecord"
            )
        entries = [e for e in entries if e[0] != name] + [(name, feat, declared)]
        auto.discard(name)
    return FeaturePlan(tuple(entries), frozenset(auto))


def wanted_features(plan: FeaturePlan | Resolved) -> frozenset[str]:
    """Every feature name the plan reads (a boxes field's four)."""
    auto = plan.auto if isinstance(plan, FeaturePlan) else frozenset()
    out = {plan.key_feature}
    for name, feat, f in plan.entries:
        if (f is not None and f.geometry == "boxes") or (name == "boxes" and name in auto):
            out.update(feat + s for s in BOX_SUFFIXES)
        else:
            out.add(feat)
    return frozenset(out)


@dataclass(frozen=True)
class Resolved:
    """A plan made concrete: every entry has its Field; ``label`` is the header field's name
    (``None``: the set has no label feature, labels are -1); ``keyed``: records carry
    ``stoker/key``."""

    entries: tuple[tuple[str, str, Field], ...]
    label: str | None
    keyed: bool
    key_feature: str = KEY_FEATURE

    def schema(self, max_len: dict[str, int] | None = None) -> Schema:
        entries = [(n, f) for n, _ft, f in self.entries]
        if self.label is None and "label" not in {n for n, _f in entries}:
            entries.insert(1, ("label", Field.numeric((), "int64", header=True)))
        return Schema(tuple(entries)).with_max_len(max_len or {})

    @property
    def header(self) -> Field:
        if self.label is None:
            return Field.numeric((), "int64", header=True)
        return next(f for n, _ft, f in self.entries if n == self.label)


def _present(feats: dict[str, RawFeature], feat: str, boxes: bool) -> bool:
    if boxes:
        return all(feat + s in feats for s in BOX_SUFFIXES)
    return feat in feats


def resolve(plan: FeaturePlan, mv: memoryview, feats: dict[str, RawFeature]) -> Resolved:
    """The concrete fields of a set whose first record is ``feats`` (parsed from ``mv``)."""
    out: list[tuple[str, str, Field]] = []
    names = {n for n, _ft, _f in plan.entries}
    label: str | None = None
    for name, feat, declared in plan.entries:
        f = declared
        if f is None:
            boxes = name == "boxes" and name in plan.auto
            if name in plan.auto and not _present(feats, feat, boxes):
                continue
            f = _infer(name, feat, feats, mv, boxes=boxes, follows="boxes" in names)
        if f.header:
            label = name
        out.append((name, feat, f))
    have = {n for n, _ft, _f in out}
    out = [
        (n, ft, Field.ragged(f.shape, f.dtype, max_len=f.max_len))
        if f.follows is not None and f.follows not in have
        else (n, ft, f)
        for n, ft, f in out
    ]
    return Resolved(tuple(out), label, plan.key_feature in feats, plan.key_feature)


def _infer(
    name: str,
    feat: str,
    feats: dict[str, RawFeature],
    mv: memoryview,
    *,
    boxes: bool,
    follows: bool,
) -> Field:
    if boxes:
        return Field.ragged((4,), "float64", geometry="boxes")
    raw = feats.get(feat)
    if raw is None or raw.kind is None:
        raise FieldError(name, f"the first record has no feature {feat!r} to infer it from")
    if name == "label" and raw.kind != "bytes":
        k = value_count(mv, raw)
        if k == 0:
            raise FieldError(name, f"feature {feat!r} holds no value", raw.start)
        return _label_field(raw.kind, k)
    if raw.kind == "bytes":
        return Field.bytes_()
    dtype = "int64" if raw.kind == "int64" else "float32"
    return Field.ragged((), dtype, follows="boxes" if name == "classes" and follows else None)


def _label_field(kind: str, k: int) -> Field:
    """The label field of ``k`` values of a ``kind`` list (a bytes list: a bytes field)."""
    if kind == "bytes":
        return Field.bytes_()
    dtype = "int64" if kind == "int64" else "float32"
    return Field.numeric(() if k == 1 else (k,), dtype, header=True)


def settle_label(plan: FeaturePlan, buf: memoryview, size: int) -> FeaturePlan:
    """``plan`` (of a bare file, ``buf`` its ``size`` bytes) with its label decided from
    every record rather than the first: the type and count of values most records hold (the
    first seen on a tie), then declared, so that a record without the label or with another
    kind is an error naming it. No record with a label value: the label is left out (every
    label -1). A record that does not frame or parse is the scan's to name."""
    if "label" not in plan.auto:
        return plan
    feat = plan.feature_names()["label"]
    votes: Counter[tuple[str, int]] = Counter()
    off = 0
    while off < size:
        try:
            data, off = read_frame(buf, size, off, check_data=False)
            raw = parse_features(data, {feat}).get(feat)
            if raw is not None and raw.kind is not None and (k := value_count(data, raw)):
                votes[raw.kind, k] += 1
        except WireError:
            continue
        except FrameError:
            break
    entries = [(n, ft, f) for n, ft, f in plan.entries if n != "label"]
    if votes:
        entries.insert(1, ("label", feat, _label_field(*votes.most_common(1)[0][0])))
    return replace(plan, entries=tuple(entries), auto=plan.auto - {"label"})


def image_hw(buf: memoryview | bytes) -> tuple[int, int]:
    """(height, width) from an image's own header: JPEG through simplejpeg, PNG from its
    IHDR, anything else through Pillow (which reads the header only)."""
    head = bytes(buf[:32])
    if head.startswith(b"\x89PNG\r\n\x1a\n") and head[12:16] == b"IHDR":
        w, h = struct.unpack(">II", head[16:24])
        return int(h), int(w)
    if head.startswith(b"\xff\xd8"):
        import simplejpeg

        try:
            h, w, _, _ = simplejpeg.decode_jpeg_header(buf)
            return int(h), int(w)
        except ValueError:
            pass  # Pillow may know better
    import io

    from PIL import Image

    with Image.open(io.BytesIO(bytes(buf))) as im:
        w, h = im.size
    return int(h), int(w)


def _one_bytes(name: str, feat: str, mv: memoryview, raw: RawFeature) -> memoryview:
    vals = bytes_values(mv, raw)
    if len(vals) != 1:
        raise FieldError(name, f"feature {feat!r} holds {len(vals)} values, not 1", raw.start)
    return vals[0]


def _numbers(name: str, feat: str, mv: memoryview, raw: RawFeature, f: Field) -> np.ndarray:
    if raw.kind == "int64":
        arr = np.asarray(int64_values(mv, raw), dtype=np.int64)
    elif raw.kind == "float":
        arr = np.asarray(float_values(mv, raw), dtype=np.float64)
    else:
        raise FieldError(name, f"feature {feat!r} is a {raw.kind} list, not numbers", raw.start)
    if arr.dtype.kind == "f" and np.dtype(f.dtype).kind in "iu":
        raise FieldError(name, f"feature {feat!r} holds floats, the field is {f.dtype}", raw.start)
    return arr


def field_value(
    name: str,
    feat: str,
    f: Field,
    mv: memoryview,
    feats: dict[str, RawFeature],
    hw: Callable[[], tuple[int, int]] | None = None,
) -> Any:
    """The value of field ``name`` in one record, as ``Field.check`` gives it (before that
    check). A boxes field gives normalised boxes when ``hw`` is ``None`` (what a scan needs:
    their count), pixel boxes otherwise (``hw()`` is the image's (height, width))."""
    if f.geometry == "boxes":
        return _boxes(name, feat, mv, feats, hw)
    raw = feats.get(feat)
    if raw is None or raw.kind is None:
        if f.variable:
            return np.zeros((0, *f.shape), f.dtype) if f.kind == "ragged" else _empty(f)
        raise FieldError(name, f"the record has no feature {feat!r}")
    if f.kind in ("image", "mask", "bytes", "text"):
        if raw.kind != "bytes":
            raise FieldError(name, f"feature {feat!r} is a {raw.kind} list, not bytes", raw.start)
        value = _one_bytes(name, feat, mv, raw)
        if f.kind == "text":
            try:
                return str(value, "utf-8")
            except UnicodeDecodeError as e:
                raise FieldError(name, f"not UTF-8 text: {e.reason}", raw.start) from None
        if f.kind != "bytes" and not len(value):
            raise FieldError(name, f"feature {feat!r} is empty", raw.start)
        return value
    arr = _numbers(name, feat, mv, raw, f)
    per = math.prod(f.shape)
    if f.kind == "numeric":
        if arr.size != per:
            raise FieldError(
                name, f"feature {feat!r} holds {arr.size} values, the field needs {per}", raw.start
            )
        return arr.reshape(f.shape)
    if arr.size % per:
        raise FieldError(
            name,
            f"feature {feat!r} holds {arr.size} values, not a multiple of {per} {f.shape}",
            raw.start,
        )
    return arr.reshape((arr.size // per, *f.shape))


def _empty(f: Field) -> str | bytes:
    return "" if f.kind == "text" else b""


def _boxes(
    name: str,
    prefix: str,
    mv: memoryview,
    feats: dict[str, RawFeature],
    hw: Callable[[], tuple[int, int]] | None,
) -> np.ndarray:
    cols: list[list[float]] = []
    for s in BOX_SUFFIXES:
        raw = feats.get(prefix + s)
        if raw is None or raw.kind is None:
            cols.append([])
            continue
        if raw.kind != "float":
            raise FieldError(name, f"feature {prefix + s!r} is a {raw.kind} list, not floats")
        cols.append(float_values(mv, raw))
    counts = {len(c) for c in cols}
    if len(counts) != 1:
        shown = ", ".join(f"{s[1:]} {len(c)}" for s, c in zip(BOX_SUFFIXES, cols))
        raise FieldError(name, f"the four box features hold different counts ({shown})")
    xmin, ymin, xmax, ymax = (np.asarray(c, dtype=np.float64) for c in cols)
    boxes = np.stack([xmin, ymin, xmax, ymax], axis=1) if xmin.size else np.zeros((0, 4))
    if hw is not None and boxes.size:
        h, w = hw()
        boxes *= np.array([w, h, w, h], dtype=np.float64)
    return boxes


def lengths_of(f: Field, value: Any) -> int:
    """Rows or bytes of a variable field's value (what ``max_len`` is the largest of)."""
    if f.kind == "text":
        return len(value.encode("utf-8"))
    return len(value)


def check_follows(
    resolved: Sequence[tuple[str, str, Field]], values: dict[str, Any]
) -> tuple[str, str] | None:
    """The first ``(field, boxes field)`` whose row counts differ, or ``None``."""
    for n, _ft, f in resolved:
        if f.follows is not None and n in values and f.follows in values:
            if len(values[n]) != len(values[f.follows]):
                return n, f.follows
    return None


#: Features the writer fills itself: a field may not be stored under one of these names.
RESERVED = frozenset(
    {IMAGE_KEY, LABEL_KEY, CLASSES_KEY, KEY_FEATURE, "image/format", "image/height", "image/width"}
    | {BOXES_KEY + s for s in BOX_SUFFIXES}
)


def feature_names(schema: Schema) -> dict[str, str]:
    """Where the writer stores each field of ``schema`` (see the package README): the image
    in ``image/encoded``, the header field in ``image/class/label``, the first boxes field in
    the ``image/object/bbox/*`` four, the first int64 ragged field that follows it in
    ``image/object/class/label``, every other field under its own name. ``ValueError`` for a
    points field (TFRecord has no convention stoker could keep them in) or a name that
    clashes with a feature the writer fills itself."""
    out: dict[str, str] = {}
    boxes: str | None = None
    for n, f in schema.items():
        if f.kind == "size":
            continue
        if f.geometry == "points":
            raise ValueError(
                f"field {n!r}: points fields are not written to TFRecord (no common convention "
                "for them there); write this set as RecordIO or WebDataset, or leave the field out"
            )
        if f.kind == "image":
            out[n] = IMAGE_KEY
        elif f.header:
            out[n] = LABEL_KEY
        elif f.geometry == "boxes" and boxes is None:
            boxes, out[n] = n, BOXES_KEY
        else:
            out[n] = n
    for n, f in schema.items():
        if (
            boxes is not None
            and f.follows == boxes
            and f.shape == ()
            and np.dtype(f.dtype).kind in "iu"
        ):
            out[n] = CLASSES_KEY
            break
    used: dict[str, str] = {}
    for n, feat in out.items():
        f = schema[n]
        names = [feat + s for s in BOX_SUFFIXES] if f.geometry == "boxes" else [feat]
        for name in names:
            if name in used or (name in RESERVED and feat == n):
                raise ValueError(
                    f"field {n!r} would be stored in feature {name!r}, which "
                    + (f"field {used[name]!r} uses" if name in used else "the writer fills itself")
                    + "; rename the field"
                )
            used[name] = n
    return out


def manifest_plan(m: dict) -> FeaturePlan:
    """The features a TFRecord set's (checked, version-2) manifest ``m`` says its records
    hold (its ``options``)."""
    from stoker.formats.manifest import manifest_schema

    schema = manifest_schema(m) or Schema.classification()
    options = m.get("options") or {}
    feats = options["features"]
    entries = tuple(
        (n, feats[n], replace(f, max_len=None)) for n, f in schema.items() if f.kind != "size"
    )
    return FeaturePlan(entries, frozenset(), options.get("key_feature", KEY_FEATURE))


def check_options(path: str, options: dict, schema: Schema | None) -> None:
    """The ``options`` of a TFRecord set's manifest: ``features`` maps each field of
    ``schema`` to the Example feature holding it (a boxes field to the prefix of its four
    ``/xmin`` ... features); ``key_feature`` names the key's feature."""
    from stoker.formats.manifest import fail

    schema = schema or Schema.classification()
    features = options.get("features")
    if not isinstance(features, dict) or any(
        not isinstance(v, str) or not v for v in features.values()
    ):
        raise fail(path, "options.features must be an object {field: feature name}")
    missing = [n for n, f in schema.items() if f.kind != "size" and n not in features]
    if missing:
        raise fail(path, f"options.features names no feature for the fields {missing}")
    if not isinstance(options.get("key_feature", KEY_FEATURE), str):
        raise fail(path, "options.key_feature must be a feature name")
