"""What a shard job stores for each position of its plan: the writer's ``(key, image,
label, fields)`` of a checked file (:func:`sample_of`), the text of a reject
(:func:`reject_detail`), and a convert's positions read and written in one process
(:func:`convert_range`).

A convert's shard job reads its positions and writes its shard in the same process: the
bytes go from the source's reader to the format's writer with no copy to another process
and no per-record object beyond the writer's own (the labels come from the plan's bulk
labels, made once per shard). The records are those a pool of workers would send back,
read in chunks of 64 positions from the shard's first: the same bytes, rejects and
manifest counts.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np

from stoker._core.progress import Progress
from stoker._core.schema import Schema
from stoker.codecs import sniff_counts
from stoker.pack.plan.listing import ListingItem
from stoker.pack.plan.plan import Plan
from stoker.pack.plan.source import SourceItems, reject_text
from stoker.pack.run.outputs import ShardWriters
from stoker.pack.run.report import ShardCounts

__all__ = ["convert_range", "label_maker", "reject_detail", "sample_of"]

_CHUNK = 64  # positions per reader call (a reader that fails on a call rejects them all)
_BATCH = 1024  # records per writer call (at least: whole reader calls)


def _head(schema: Schema | None) -> Any:
    """The schema's header field (the label), or ``None``."""
    return schema[schema.header_name] if schema is not None and schema.header_name else None


def label_maker(schema: Schema | None) -> Callable[[Any], Any]:
    """Turns an item's label into what the writer takes: the schema's header dtype (a
    class id as an int), a vector as an array."""
    head = _head(schema)
    int_head = head is not None and np.dtype(head.dtype).kind in "iu"
    vec_dtype = np.float32 if head is None else head.dtype

    def make(label: Any) -> Any:
        if isinstance(label, tuple):
            return np.asarray(label, vec_dtype)
        if int_head and float(label).is_integer():
            return int(label)
        return float(label)

    return make


def sample_of(plan: Plan, pos: int, r: tuple) -> tuple:
    """``(key, image bytes, label, fields)`` for the writer from a worker's result ``r`` for
    the file at position ``pos`` (a listing's row: its fields, and the masks a worker read)."""
    item = plan.items[pos]
    fields = None
    if isinstance(item, ListingItem):
        fields = {**item.fields, **(r[6] if len(r) > 6 else {})}
    return int(plan.keys[pos]), r[1], label_maker(plan.writer_schema)(item.label), fields


def reject_detail(plan: Plan, pos: int, detail: str) -> str:
    """A reject's detail as the rejects list gives it (a listing's line number first)."""
    item = plan.items[pos]
    return (f"line {item.line}: " if isinstance(item, ListingItem) else "") + detail


def _bulk_labels(schema: Schema | None, rows: np.ndarray) -> list[Any]:
    """:func:`label_maker`'s label of each number of ``rows`` (1-d, bool, integer or
    float), converted as whole arrays: an int for an integer header where the number is
    whole, else a float."""
    head = _head(schema)
    if head is None or np.dtype(head.dtype).kind not in "iu":
        return rows.astype(np.float64).tolist()
    if rows.dtype.kind in "iub":
        return rows.astype(np.int64 if rows.dtype.kind == "b" else rows.dtype).tolist()
    if (np.isfinite(rows) & (rows == np.floor(rows)) & (np.abs(rows) < 2.0**62)).all():
        return rows.astype(np.int64).tolist()
    return [label_maker(schema)(v) for v in rows.tolist()]


def _sources(plan: Plan, a: int, b: int) -> tuple[np.ndarray, list[Any]]:
    """The source positions of plan positions ``[a, b)`` and the writer's label of each."""
    items = plan.items
    if isinstance(items, SourceItems):  # in the source's order: bulk labels, no item made
        rows = items.labels[a:b]
        if rows.ndim == 1 and rows.dtype.kind in "iubf":
            return np.arange(a, b, dtype=np.int64), _bulk_labels(plan.writer_schema, rows)
        chunk = items[a:b]
    else:
        chunk = list(items[a:b])
    pos = np.asarray([it.pos for it in chunk], dtype=np.int64)  # type: ignore[attr-defined]
    make = label_maker(plan.writer_schema)
    return pos, [make(it.label) for it in chunk]


def convert_range(
    plan: Plan,
    a: int,
    b: int,
    s: int,
    writers: ShardWriters,
    counts: ShardCounts,
    rejects: list[list],
    lengths: dict[str, int],
    bar: Progress | None = None,
) -> None:
    """Read the source's records of plan positions ``[a, b)`` and write them into shard
    ``s`` in this process: each stored record counted into ``counts``, each one that cannot
    be read or stored a ``[position, reason, detail]`` row of ``rejects`` (in position
    order), the variable fields' longest lengths into ``lengths``."""
    reader = plan.reader
    schema = plan.writer_schema
    assert reader is not None and schema is not None
    names = tuple(reader.schema.stored)
    variable = [(n, f) for n, f in schema.stored.items() if f.variable]
    src, labels = _sources(plan, a, b)
    out = _Batch(writers, s, a, plan.keys[a:b].tolist(), labels, rejects)
    first_reject = len(rejects)
    as_bytes = reader.stored_bytes
    for c in range(0, b - a, _CHUNK):
        idx = src[c : c + _CHUNK]
        try:
            f = reader.reader(idx, names)
        except Exception as e:  # noqa: BLE001 - the whole chunk is unreadable: each a reject
            rejects.extend(
                [a + c + j, "unreadable", reject_text(reader, i, e)]
                for j, i in enumerate(idx.tolist())
            )
            continue
        js, images, fieldss = out.js, out.images, out.fields
        for j, i in enumerate(idx.tolist(), c):
            try:
                image, _label, _key, fields = f(i)
                data = bytes(as_bytes(image))
            except Exception as e:  # noqa: BLE001 - a bad record is a reject, never a crash
                rejects.append([a + j, "unreadable", reject_text(reader, i, e)])
                continue
            for n, fld in variable:
                if n in fields:
                    lengths[n] = max(lengths.get(n, 0), fld.length(fields[n]))
            js.append(j)
            images.append(data)
            fieldss.append(fields)
        if len(js) >= _BATCH:
            out.flush()
        if bar is not None:
            bar.update(len(idx))
    out.flush()
    rejects[first_reject:] = sorted(rejects[first_reject:])
    counts.add_stored(out.stored, out.formats, out.nbytes)


class _Batch:
    """The records read and not yet written (their offsets ``js`` from the shard's first
    position, bytes and fields), written ``_BATCH`` or so at a time through the writer's
    ``write_many``; what was stored, counted once for the shard."""

    def __init__(
        self,
        writers: ShardWriters,
        s: int,
        a: int,
        keys: list[int],
        labels: list[Any],
        rejects: list[list],
    ) -> None:
        self.writers, self.s, self.a, self.keys, self.labels = writers, s, a, keys, labels
        self.rejects = rejects
        self.js: list[int] = []
        self.images: list[bytes] = []
        self.fields: list[Any] = []
        self.stored: list[int] = []
        self.formats: collections.Counter[str] = collections.Counter()
        self.nbytes = 0

    def flush(self) -> None:
        js, images = self.js, self.images
        if not js:
            return
        keys, labels = self.keys, self.labels
        errors = self.writers.write_many(
            self.s, [keys[j] for j in js], images, [labels[j] for j in js], self.fields
        )
        if errors:
            bad = {j for j, _ in errors}
            self.rejects.extend([self.a + js[j], "unstorable", why] for j, why in errors)
            images = [d for j, d in enumerate(images) if j not in bad]
            js = [x for j, x in enumerate(js) if j not in bad]
        a = self.a
        self.stored.extend([a + j for j in js])
        self.formats.update(sniff_counts(images))
        self.nbytes += sum(map(len, images))
        self.js, self.images, self.fields = [], [], []
