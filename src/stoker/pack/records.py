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
from stoker.pack.listing import ListingItem
from stoker.pack.outputs import ShardWriters, Unstorable
from stoker.pack.plan import Plan
from stoker.pack.report import ShardCounts
from stoker.pack.source import SourceItems, reject_text

__all__ = ["convert_range", "label_maker", "reject_detail", "sample_of"]

_CHUNK = 64  # positions per reader call (a reader that fails on a call rejects them all)


def label_maker(schema: Schema | None) -> Callable[[Any], Any]:
    """Turns an item's label into what the writer takes: the schema's header dtype (a
    class id as an int), a vector as an array."""
    head = schema[schema.header_name] if schema is not None and schema.header_name else None
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


def _sources(plan: Plan, a: int, b: int) -> tuple[np.ndarray, list[Any]]:
    """The source positions of plan positions ``[a, b)`` and the writer's label of each."""
    make = label_maker(plan.writer_schema)
    items = plan.items
    if isinstance(items, SourceItems):  # in the source's order: bulk labels, no item made
        rows = items.labels[a:b]
        if rows.ndim == 1 and rows.dtype.kind in "iubf":
            conv = int if rows.dtype.kind in "iub" else float
            return np.arange(a, b, dtype=np.int64), [make(conv(v)) for v in rows.tolist()]
        chunk = items[a:b]
    else:
        chunk = list(items[a:b])
    pos = np.asarray([it.pos for it in chunk], dtype=np.int64)  # type: ignore[attr-defined]
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
    be read or stored a ``[position, reason, detail]`` row of ``rejects``, the variable
    fields' longest lengths into ``lengths``."""
    from stoker.codecs import sniff

    reader = plan.reader
    schema = plan.writer_schema
    assert reader is not None and schema is not None
    names = tuple(reader.schema.stored)
    variable = [(n, f) for n, f in schema.stored.items() if f.variable]
    keys = plan.keys[a:b].tolist()
    src, labels = _sources(plan, a, b)
    write = writers.write
    stored: list[int] = []  # counted into ``counts`` at the end: nothing per record but this
    formats: collections.Counter[str] = collections.Counter()
    nbytes = 0
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
        for j, i in enumerate(idx.tolist(), c):
            try:
                image, _label, _key, fields = f(i)
                data = bytes(reader.stored_bytes(image))
            except Exception as e:  # noqa: BLE001 - a bad record is a reject, never a crash
                rejects.append([a + j, "unreadable", reject_text(reader, i, e)])
                continue
            fields = dict(fields)
            for n, fld in variable:
                if n in fields:
                    lengths[n] = max(lengths.get(n, 0), fld.length(fields[n]))
            try:
                write(s, keys[j], data, labels[j], fields)
            except Unstorable as e:
                rejects.append([a + j, "unstorable", str(e)])
                continue
            stored.append(a + j)
            formats[sniff(data)] += 1
            nbytes += len(data)
        if bar is not None:
            bar.update(len(idx))
    counts.add_stored(stored, formats, nbytes)
