"""The run's plan: which files, in which order, under which keys and in which shard, all fixed
before any image is read.

For an image folder the key of a file is its position in the (sorted or shuffled) list of
candidate image files (from 1 in an insightface layout, whose header record is key 0); a file
rejected while checking leaves a gap. For an im2rec list the key
is the list's index column, as im2rec does. Shard ``s`` (``shard_size=N``) holds positions
``[s*N, (s+1)*N)``, so rejects make shards slightly short.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._core.errors import PackError
from stoker._core.schema import Schema
from stoker._core.seeding import stream_rng
from stoker.pack.plan.listing import ListingItem, is_listing, read_listing
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.scan import Item, ScanResult, read_lst, scan_folder

__all__ = ["Plan", "fingerprint", "geometric", "make_plan"]

_DOMAIN_SHUFFLE = 0x50414B53  # "PAKS"


@dataclass
class Plan:
    """The listing, the items in record order, their keys, and the shard layout."""

    scan: ScanResult
    from_lst: bool  # the source is an im2rec list (keys from its index column)
    items: list[Item]
    keys: np.ndarray  # int64, by position
    shard_size: int | None
    prefix: str
    #: a listing's schema (``None`` for a folder or an im2rec list: an image and its label)
    schema: Schema | None = None
    #: what each sample is to the format's writer: the listing's or the source's schema, else
    #: an image and its label (a class id, or the im2rec list's numbers)
    writer_schema: Schema | None = None
    #: a convert's source (``None`` when packing files)
    reader: Any = None

    @property
    def n_shards(self) -> int:
        if self.shard_size is None:
            return 1
        return max(1, -(-len(self.items) // self.shard_size))

    def shard_id(self, s: int) -> int | None:
        """What a format's writer is told shard ``s`` is (``None``: the one unsharded file)."""
        return None if self.shard_size is None else s


def _list_source(options: PackOptions) -> tuple[ScanResult, bool, Schema | None]:
    """The source's listing, whether it is an im2rec list, and a listing's schema."""
    src = os.fspath(options.src)
    if os.path.isdir(src):
        scan = scan_folder(src, follow_symlinks=options.follow_symlinks)
        return _folder_labels(src, scan, options.labels), False, None
    if options.labels != "folders" and os.path.exists(src):
        raise PackError(
            f"{src}: labels={options.labels!r} (--labels {options.labels}) is for an image "
            "folder; an im2rec .lst or a listing carries its own labels"
        )
    if os.path.isfile(src) and src.endswith(".lst"):
        lst = read_lst(src, root=options.root, allow_outside_root=options.allow_outside_root)
        return lst, True, None
    if os.path.isfile(src) and is_listing(src):
        scan, schema = read_listing(
            src,
            root=options.root,
            allow_outside_root=options.allow_outside_root,
            schema=options.schema,
        )
        return scan, False, schema
    if not os.path.exists(src):
        raise PackError(f"{src}: no such file or folder")
    raise PackError(f"{src}: give an image folder, an im2rec .lst, or a .jsonl/.csv listing")


def _folder_labels(src: str, scan: ScanResult, labels: str) -> ScanResult:
    """A folder's listing with the labels ``labels`` asks for. ``"folders"``: one class per
    top-level subfolder, and a folder of images with no subfolder is refused (packing it would
    give every image class 0 without a word); ``"none"``: every image labelled 0, no class
    names."""
    if labels == "none":
        scan.items = [dataclasses.replace(it, label=0.0) for it in scan.items]
        scan.classes = {}
    elif not scan.classes and scan.items:
        raise PackError(
            f"{src}: {len(scan.items)} images but no class subfolders; stoker pack takes one "
            "class per top-level subfolder (SRC/<class>/<image>). Move the images into class "
            "folders, or pack them without labels with --labels none (labels='none'): every "
            "record labelled 0, no class names"
        )
    return scan


def _label_schema(items: list[Item], from_lst: bool) -> Schema:
    """An image and its label: a class id for a folder; an im2rec list's numbers (whole
    numbers as class ids, a vector when every line has the same several)."""
    if not from_lst:
        return Schema.classification()
    sizes = {len(it.label) if isinstance(it.label, tuple) else 0 for it in items}
    if len(sizes) == 1 and sizes != {0}:
        return Schema.classification((sizes.pop(),), "float32")
    if sizes == {0} and all(float(it.label).is_integer() for it in items):  # type: ignore[arg-type]
        return Schema.classification()
    return Schema.classification((), "float32")


def make_plan(options: PackOptions) -> Plan:
    """List the source once (a snapshot) and fix the order and keys of every record."""
    reader = None
    if options.convert:
        from stoker.pack.plan.source import open_source

        scan, reader = open_source(options)
        from_lst, schema = False, None
    else:
        scan, from_lst, schema = _list_source(options)
    if options.schema is not None and schema is None:
        raise PackError(f"{options.src}: schema is for a .jsonl or .csv listing")
    if schema is not None and options.resize is not None and geometric(schema):
        raise PackError(
            f"{options.src}: resize would move the images under their "
            f"{[n for n, f in schema.items() if f.geometry or f.kind == 'mask']} fields; "
            "pack at the stored size and resize in the loader's transforms"
        )
    if options.layout == "insightface":
        scan = _identity_scan(options, scan, from_lst or schema is not None)
    items = scan.items
    if options.shuffle:
        perm = stream_rng(options.seed, _DOMAIN_SHUFFLE, len(items)).permutation(len(items))
        items = [items[i] for i in perm]
    if reader is not None and not options.shuffle:
        keys = scan.items.keys  # type: ignore[attr-defined]
    elif from_lst or reader is not None:
        keys = np.asarray([it.key for it in items], dtype=np.int64)
    else:  # an insightface layout keeps key 0 for its header record
        first = 1 if options.layout == "insightface" else 0
        keys = np.arange(first, first + len(items), dtype=np.int64)
    if reader is not None:
        writer_schema = reader.schema
    else:
        writer_schema = schema if schema is not None else _label_schema(items, from_lst)
    return Plan(
        scan,
        from_lst,
        items,
        keys,
        options.shard_size,
        options.prefix,
        schema,
        writer_schema,
        reader,
    )


def _identity_scan(options: PackOptions, scan: ScanResult, listed: bool) -> ScanResult:
    """A folder's walk in insightface record order (``identities.py``)."""
    if listed or not os.path.isdir(os.fspath(options.src)):
        raise PackError(
            f"{options.src}: layout='insightface' (--layout insightface) packs an image folder "
            "with one identity per subfolder, not a list"
        )
    from stoker.pack.plan.identities import identity_order

    return identity_order(os.fspath(options.src), scan)


def geometric(schema: Schema) -> bool:
    """Whether a schema has fields tied to the image's pixels (boxes, points, masks)."""
    return any(f.geometry is not None or f.kind == "mask" for f in schema.values())


def fingerprint(plan: Plan, settings: dict[str, Any]) -> str:
    """A digest of the settings and of every record's key, label and path: a rerun resumes
    the partial output only when it is equal."""
    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode())
    if plan.reader is not None:  # a convert: the source's identity, keys and labels in order
        from stoker.pack.plan.source import source_digest

        labels = plan.scan.items.labels  # type: ignore[attr-defined]
        if plan.items is not plan.scan.items:
            labels = np.asarray([it.label for it in plan.items], dtype=object).astype(str)
        h.update(source_digest(plan.reader, plan.keys, labels))
        return h.hexdigest()
    if plan.schema is not None:  # a listing: its schema and every row's fields too
        h.update(json.dumps(plan.schema.to_json(), sort_keys=True).encode())
    for key, it in zip(plan.keys.tolist(), plan.items):
        h.update(f"{key}\t{it.label!r}\t".encode())
        h.update(os.fsencode(it.path))
        if isinstance(it, ListingItem):
            h.update(_fields_digest(it))
        h.update(b"\n")
    return h.hexdigest()


def _fields_digest(it: ListingItem) -> bytes:
    h = hashlib.sha256()
    for name, v in it.fields.items():
        h.update(name.encode() + b"\0")
        h.update(v.encode() if isinstance(v, str) else v if isinstance(v, bytes) else v.tobytes())
        h.update(repr(v.shape if isinstance(v, np.ndarray) else None).encode())
    for name, path in it.masks:
        h.update(f"{name}\0{path}\0".encode("utf-8", "surrogateescape"))
    return h.digest()
