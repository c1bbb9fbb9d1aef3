"""The record order of ``stoker pack --layout insightface``: one identity per class folder,
each identity's images together, keyed ``1..N``.

- Identities: the class folders in the folder walk's order (sorted names), or, when the
  source holds the identity table ``stoker unpack`` writes beside an insightface set's images
  (:data:`~stoker.formats.recordio.IDENTITY_TABLE`), in the table's order: identity ``j`` is
  the folder the table names for it, and gets label ``j``.
- Inside an identity: by the number in the file name when every name there is one (what
  ``stoker unpack`` writes: ``<key>.<ext>``), else the walk's order.

So ``stoker unpack`` of an insightface set followed by ``stoker pack --layout insightface``
gives its records back in the same order, under the same keys and labels.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from stoker._core.errors import PackError
from stoker.formats.recordio import IDENTITY_TABLE
from stoker.pack.plan.scan import Item, ScanResult

__all__ = ["identity_order"]

#: the most of an identity table read (MS1M's 85,742 identities take about 7 MB)
_TABLE_LIMIT = 256 << 20


def _table_folders(path: str) -> list[str]:
    """The folder of each identity in an identity table, in identity order."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(_TABLE_LIMIT).decode("utf-8"))
        rows = doc["identities"]
        folders = [row["folder"] for row in rows]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PackError(f"{path}: not an identity table stoker unpack writes ({e})") from None
    for j, name in enumerate(folders):
        if not isinstance(name, str) or not name:
            raise PackError(
                f"{path}: identity {j} names no folder (its images carry several labels); "
                "remove the table to order identities by folder name"
            )
    if len(set(folders)) != len(folders):
        raise PackError(f"{path}: two identities name the same folder")
    return folders


def _number(item: Item) -> int | None:
    stem = os.path.splitext(os.path.basename(item.rel))[0]
    return int(stem) if stem.isdigit() and stem.isascii() else None


def identity_order(src: str, scan: ScanResult) -> ScanResult:
    """``scan`` (a folder's walk, one class per folder) in insightface record order."""
    classes = dict(scan.classes)
    table = os.path.join(src, IDENTITY_TABLE)
    if os.path.isfile(table):
        folders = _table_folders(table)
        missing = sorted(set(classes) - set(folders))
        if missing:
            raise PackError(
                f"{table}: the folder {missing[0]!r} is no identity in it ({len(missing)} "
                "folders are not); pack without the table, or add them to it"
            )
        classes = {name: j for j, name in enumerate(folders)}
    names = {old: name for name, old in scan.classes.items()}
    by_class: dict[int, list[Item]] = {}
    for it in scan.items:
        new = classes[names[int(it.label)]]  # type: ignore[arg-type]
        by_class.setdefault(new, []).append(dataclasses.replace(it, label=float(new)))
    empty = sorted(name for name, j in classes.items() if j not in by_class)
    if empty:
        raise PackError(
            f"{src}: the identity folder {empty[0]!r} holds no image ({len(empty)} are empty); "
            "an insightface identity record names a range of one image or more"
        )
    items: list[Item] = []
    for label in sorted(by_class):
        group = by_class[label]
        numbers: list[Any] = [_number(it) for it in group]
        if None not in numbers:
            group = [it for _, it in sorted(zip(numbers, group), key=lambda p: p[0])]
        items.extend(group)
    return dataclasses.replace(scan, items=items, classes=classes)
