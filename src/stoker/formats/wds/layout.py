"""How WebDataset samples map onto stoker's schema: which member suffixes are images, which is
the label, which name a field takes, and the schema of a tar that has no manifest.

A member name splits into a key and a suffix at the first dot of its basename (WebDataset's
rule: ``a/b/x001.seg.png`` is key ``a/b/x001``, suffix ``seg.png``); the suffix is lowercased.
Consecutive members with one key form one sample.

- image: exactly one member whose suffix is an image type (``jpg``, ``jpeg``, ``png``,
  ``webp``, and the other types stoker decodes: ``bmp``, ``gif``, ``tif``, ``tiff``, ``ppm``,
  ``pgm``);
- label: ``cls``, a decimal integer in ASCII (surrounding whitespace allowed);
- a stored field ``name``: suffix ``name`` lowercased for ``text``, ``bytes`` and ``mask``
  fields, ``name.json`` (a JSON array or number) for ``numeric`` and ``ragged`` ones;
- a tar without a manifest: ``txt`` is the text field ``"txt"`` (a caption) and ``json`` the
  text field ``"json"`` (the document as text: parsing untrusted JSON is left to the user);
  other suffixes are ignored.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from stoker._core.crc import crc32c
from stoker._core.errors import SpecError
from stoker._core.files import IMAGE_EXTENSIONS
from stoker._core.schema import Field, Schema

__all__ = [
    "IMAGE_SUFFIXES",
    "LABEL_SUFFIX",
    "MAX_CLS_BYTES",
    "RAW_FIELDS",
    "common_suffix",
    "crc_path",
    "field_suffixes",
    "image_suffix",
    "parse_cls",
    "raw_schema",
    "sample_crc",
    "split_name",
]

IMAGE_SUFFIXES = frozenset(e[1:] for e in IMAGE_EXTENSIONS)
LABEL_SUFFIX = "cls"
#: A ``.cls`` member longer than this is not a class number; refused before it is read.
MAX_CLS_BYTES = 64
#: The fields of a tar without a manifest: suffix -> field name.
RAW_FIELDS = {"txt": "txt", "json": "json"}
_SPLIT = re.compile(rb"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META = re.compile(rb"__[^/]*__($|/)")
_CLS = re.compile(rb"\s*[-+]?[0-9]{1,19}\s*\Z")
_INT64 = 1 << 63


def split_name(name: bytes) -> tuple[bytes, str] | None:
    """``(key, lowercased suffix)`` of a member name, or ``None`` for a name WebDataset skips
    (no dot in the basename, a hidden file, a ``__name__`` meta entry)."""
    if _META.match(name) or (b"/" not in name and name.startswith(b"__") and name.endswith(b"__")):
        return None
    m = _SPLIT.match(name)
    if m is None:
        return None
    return m.group(1), m.group(2).decode("utf-8", "backslashreplace").lower()


def parse_cls(data: bytes) -> int | None:
    """The class number in a ``.cls`` member, or ``None`` when it is not one."""
    if _CLS.match(data) is None:
        return None
    value = int(data)
    return value if -_INT64 <= value < _INT64 else None


_SNIFF = (
    (b"\xff\xd8\xff", 0, "jpg"),
    (b"\x89PNG\r\n\x1a\n", 0, "png"),
    (b"WEBP", 8, "webp"),
    (b"GIF8", 0, "gif"),
    (b"BM", 0, "bmp"),
    (b"II*\x00", 0, "tif"),
    (b"MM\x00*", 0, "tif"),
    (b"P6", 0, "ppm"),
    (b"P5", 0, "pgm"),
)


def image_suffix(image: bytes | memoryview) -> str | None:
    """The member suffix for encoded image bytes (``jpg``, ``png``, ``webp``...), from their
    first bytes; ``None`` when they are no image type stoker reads."""
    head = bytes(memoryview(image)[:12])
    for magic, at, suffix in _SNIFF:
        if head[at : at + len(magic)] == magic:
            if suffix == "webp" and head[:4] != b"RIFF":
                continue
            return suffix
    return None


def common_suffix(images: Sequence[bytes]) -> str | None:
    """The suffix of every one of ``images`` when :func:`image_suffix` tells the first kind
    it knows (JPEG) for all of them, found by one C call over them (``bytes`` only); else
    ``None`` (ask :func:`image_suffix` one by one)."""
    magic, at, suffix = _SNIFF[0]
    try:
        jpeg = all(map(bytes.startswith, images, itertools.repeat(magic), itertools.repeat(at)))
    except TypeError:  # a buffer that is not bytes
        return None
    return suffix if jpeg and images else None


def field_suffixes(schema: Schema) -> dict[str, str]:
    """Stored field name -> member suffix (see the module docstring); ``SpecError`` for a
    name that cannot be a suffix or two fields that would share one."""
    taken = set(IMAGE_SUFFIXES) | {LABEL_SUFFIX}
    out: dict[str, str] = {}
    for name, f in schema.stored.items():
        if "/" in name:
            raise SpecError(f"field {name!r}: a WebDataset suffix cannot hold '/'")
        suffix = name.lower() + (".json" if f.kind in ("numeric", "ragged") else "")
        if suffix in taken:
            raise SpecError(
                f"field {name!r} would be stored as '.{suffix}', which is taken (the image "
                "types, 'cls' and the other fields); rename the field"
            )
        taken.add(suffix)
        out[name] = suffix
    return out


def raw_schema(max_len: dict[str, int]) -> Schema:
    """The schema of a tar without a manifest: the image, its ``cls`` label (int64) and a
    text field for each of ``txt``/``json`` that the set holds (``max_len``: field name ->
    the largest member, in bytes)."""
    fields: dict[str, Field] = {
        "image": Field.image(),
        "label": Field.numeric((), "int64", header=True),
    }
    for name in RAW_FIELDS.values():
        if name in max_len:
            fields[name] = Field.text(max_len=max_len[name])
    return Schema(fields)


def crc_path(tar: str) -> str:
    """The per-sample checksum side-car of ``NAME.tar``: ``NAME.crc32c``."""
    return (tar[:-4] if tar.endswith(".tar") else tar) + ".crc32c"


def sample_crc(members: Sequence[bytes | memoryview]) -> int:
    """The CRC32C of one sample: its members' data (image, ``.cls``, fields), chained in
    member order. Tar headers and padding are not part of it: a flip there changes the
    members the index finds, which the reader names on its own."""
    value = 0
    for data in members:
        value = crc32c(data, value)
    return value
