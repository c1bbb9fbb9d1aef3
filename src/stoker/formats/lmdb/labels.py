"""Labels of an LMDB database: how they are given, read and cached.

A Datum database carries a label in every value. An LSUN-style database (key -> image) has
none; its labels come from the options of ``open_reader``:

- ``label=3``: one class for the whole database (LSUN ships one database per category);
- ``labels={key: label}``: a mapping (keys as ``str``, encoded as UTF-8, or ``bytes``);
- ``labels="train_labels.csv"``: a text file of ``key,label`` lines (a tab or spaces may stand
  for the comma; the label is the last column, so a key may itself hold commas), UTF-8, with
  blank lines, ``#`` comments and a first ``key,label`` header line allowed;
- neither: every sample has label 0 (a one-class database).

Every key of the database must have a label (the first one without is named); keys of a list
that the database does not hold are ignored, so one list may serve several databases.

Labels that cost a pass over the database (Datum) or over a list file are cached in the cache
directory (kind ``lmdb-labels``, keyed by ``data.mdb``; the file name also carries what the
labels came from). Layout (little-endian): magic ``b"STKLML\\x00\\x01"`` (8), version uint32 = 1,
reserved uint32, count N uint64, LMDB last transaction id uint64, then N int64 labels.
"""

from __future__ import annotations

import contextlib
import hashlib
import operator
import os
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from stoker._core.atomic import write_cache_file
from stoker._core.cache import cache_file, file_identity
from stoker.formats.lmdb.keylist import KeyList
from stoker.formats.lmdb.location import LmdbFormatError

__all__ = [
    "MAX_LABEL_FILE_BYTES",
    "cached_labels",
    "check_label_options",
    "file_tag",
    "labels_for_keys",
    "normalise_mapping",
    "read_label_file",
]

#: A label list is read whole; one for tens of millions of keys stays far below this.
MAX_LABEL_FILE_BYTES = 2 << 30
_MAGIC = b"STKLML\x00\x01"
_HEAD = struct.Struct("<8sIIQQ")  # 32 bytes


def _label(v: Any, where: str) -> int:
    if isinstance(v, bool):
        raise ValueError(f"{where}: a label must be an integer, got {v!r}")
    try:
        out = operator.index(v)
    except TypeError:
        raise ValueError(f"{where}: a label must be an integer, got {v!r}") from None
    if not -(1 << 63) <= out < 1 << 63:
        raise ValueError(f"{where}: label {out} does not fit int64")
    return out


def normalise_mapping(m: Mapping[Any, Any]) -> dict[bytes, int]:
    """``{key bytes: int label}`` from a mapping keyed by ``str`` (UTF-8) or ``bytes``."""
    out: dict[bytes, int] = {}
    for k, v in m.items():
        if isinstance(k, str):
            kb = k.encode("utf-8")
        elif isinstance(k, (bytes, bytearray, memoryview)):
            kb = bytes(k)
        else:
            raise TypeError(f"labels= keys must be str or bytes, got {type(k).__name__}")
        if kb in out:
            raise ValueError(f"labels=: key {k!r} is given twice (as str and as bytes)")
        out[kb] = _label(v, f"labels=[{k!r}]")
    return out


def check_label_options(
    label: Any, labels: Any, class_names: Any
) -> tuple[int | None, dict[bytes, int] | str | None, list[str] | None]:
    """``(label, labels, class_names)`` checked: an int; a mapping made ``{bytes: int}`` or a
    file path; a list of str."""
    if label is not None and labels is not None:
        raise ValueError("give label= (one class for the database) or labels=, not both")
    one = None if label is None else _label(label, "label=")
    many: dict[bytes, int] | str | None = None
    if isinstance(labels, Mapping):
        many = normalise_mapping(labels)
    elif isinstance(labels, (str, os.PathLike)):
        many = os.fspath(labels)
        if not os.path.isfile(many):
            raise FileNotFoundError(f"labels={many!r}: no such file")
    elif labels is not None:
        raise TypeError(
            f"labels= must be a mapping {{key: label}} or a key,label text file, got "
            f"{type(labels).__name__}"
        )
    names = None
    if class_names is not None:
        names = list(class_names)
        if not all(isinstance(n, str) for n in names):
            raise TypeError("class_names must be a sequence of str")
    return one, many, names


def _split(line: str) -> tuple[str, str] | None:
    for sep in (",", "\t"):
        if sep in line:
            k, _, v = line.rpartition(sep)
            return k.strip(), v.strip()
    parts = line.rsplit(None, 1)
    return (parts[0], parts[1]) if len(parts) == 2 else None


def read_label_file(path: str) -> dict[bytes, int]:
    """``{key bytes: label}`` of a ``key,label`` text file (see the module docstring); errors
    name the file and the line."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_LABEL_FILE_BYTES:
            raise ValueError(f"{path}: {size} bytes, over the {MAX_LABEL_FILE_BYTES}-byte cap")
        raw = f.read(MAX_LABEL_FILE_BYTES + 1)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    out: dict[bytes, int] = {}
    line_of: dict[bytes, int] = {}
    first = True
    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        pair = _split(s)
        if pair is None or not pair[0]:
            raise ValueError(f"{path}, line {lineno}: expected 'key,label', got {s[:80]!r}")
        k, v = pair
        if first and v.lower() == "label":
            first = False
            continue  # a header line
        first = False
        try:
            lab = int(v) if len(v) <= 20 else None
        except ValueError:
            lab = None
        if lab is None:
            raise ValueError(f"{path}, line {lineno}: label {v[:40]!r} is not an integer")
        kb = k.encode("utf-8")
        if kb in out:
            raise ValueError(
                f"{path}, line {lineno}: key {k!r} already has a label on line {line_of[kb]}"
            )
        out[kb] = _label(lab, f"{path}, line {lineno}")
        line_of[kb] = lineno
    return out


def labels_for_keys(
    keys: KeyList, mapping: Mapping[bytes, int], source: str, db: str
) -> np.ndarray:
    """int64 labels by position; :class:`LmdbFormatError` names the first key without one."""
    out = np.empty(len(keys), dtype=np.int64)
    get = mapping.get
    for i in range(len(keys)):
        k = keys.key(i)
        v = get(k)
        if v is None:
            raise LmdbFormatError(db, f"has no label in {source}", key=k, position=i)
        out[i] = v
    return out


def file_tag(path: str) -> str:
    """What a label list file is, for the cache entry's name: a changed file gets a new one."""
    ident = "\0".join(str(x) for x in file_identity(path))
    return "file-" + hashlib.sha256(ident.encode()).hexdigest()[:16]


def _read(path: str, n: int, txnid: int) -> np.ndarray | None:
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD.size)
            if len(head) != _HEAD.size or os.fstat(f.fileno()).st_size != _HEAD.size + 8 * n:
                return None
            magic, version, _, count, built = _HEAD.unpack(head)
            if magic != _MAGIC or version != 1 or count != n or built != txnid:
                return None
            body = f.read(8 * n)
    except OSError:
        return None
    if len(body) != 8 * n:
        return None
    return np.frombuffer(body, dtype="<i8").astype(np.int64)


def cached_labels(
    data_file: str, tag: str, n: int, txnid: int, compute: Callable[[], np.ndarray]
) -> np.ndarray:
    """``compute()``'s labels, read from the cache entry ``tag`` of ``data_file`` when valid."""
    path = None
    with contextlib.suppress(OSError):
        path = cache_file("lmdb-labels", data_file, f".{tag}.stklml")
    if path is not None:
        got = _read(path, n, txnid)
        if got is not None:
            return got
    out = compute()
    if path is not None:
        head = _HEAD.pack(_MAGIC, 1, 0, n, txnid)
        write_cache_file(path, [head, out.astype("<i8").tobytes()])
    return out
