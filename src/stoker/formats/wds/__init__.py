"""WebDataset tar shards, read and written: samples grouped by key prefix (``x001.jpg``,
``x001.cls``, ``x001.txt``), random access through a member index built with one pass over the
headers and cached in the cache directory, tar headers checked before they are believed.

See ``README.md`` in this folder for the layout, the grouping rules, the index cache and the
safety rules.

- :func:`open_reader` opens a ``.tar`` or a stoker-wds ``NAME.stoker.json`` (a
  :class:`WdsReader`, the :class:`~stoker.formats.Reader` contract);
- :func:`open_writer` writes one shard (:class:`WdsShardWriter`), :func:`write_set_manifest`
  the set's manifest;
- :func:`verify` walks every header and sample and reports each problem.
"""

from __future__ import annotations

import os
from typing import Any

from stoker.formats.manifest import load, validate
from stoker.formats.shards import MAX_OPEN_SHARDS
from stoker.formats.spec import Dialect, Format
from stoker.formats.wds.index import index_file, parse_cache
from stoker.formats.wds.layout import (
    IMAGE_SUFFIXES,
    LABEL_SUFFIX,
    RAW_FIELDS,
    field_suffixes,
    raw_schema,
    split_name,
)
from stoker.formats.wds.reader import WdsReader, open_reader
from stoker.formats.wds.tarfmt import TarError, checksum, ustar_header
from stoker.formats.wds.verify import verify
from stoker.formats.wds.writer import (
    KIND,
    WdsShardWriter,
    open_writer,
    shard_path,
    write_set_manifest,
)

__all__ = [
    "FORMAT",
    "FORMAT_NAME",
    "IMAGE_SUFFIXES",
    "LABEL_SUFFIX",
    "MAX_OPEN_SHARDS",
    "RAW_FIELDS",
    "TarError",
    "WdsReader",
    "WdsShardWriter",
    "checksum",
    "field_suffixes",
    "index_file",
    "load_manifest",
    "open_reader",
    "open_writer",
    "parse_cache",
    "raw_schema",
    "shard_path",
    "split_name",
    "ustar_header",
    "validate_manifest",
    "verify",
    "write_set_manifest",
]

_W = "stoker.formats.wds"
#: The ``format`` field of the version-1 manifests (``FORMAT.v1.format``).
FORMAT_NAME = "stoker-wds"


def load_manifest(path: str | os.PathLike[str]) -> dict:
    """Read and check a WebDataset set's manifest (the one schema; a version-1 manifest is
    translated); its shards are :class:`~stoker.formats.shards.ShardEntry` objects."""
    return load(path, kind=KIND)


def validate_manifest(m: Any, path: str = "<manifest>") -> dict:
    """Check a WebDataset set's manifest; returns it as version 2."""
    return validate(m, path, KIND)


#: The format, as the registry lists it (:mod:`stoker.formats.spec`).
FORMAT = Format(
    "wds",
    f"{_W}:open_reader",
    (".tar",),
    writer=f"{_W}:open_writer",
    manifest=f"{_W}:write_set_manifest",
    verify=f"{_W}:verify",
    remote=True,
    roles={"data": ".tar", "crc": ".crc32c", "index": ".stkwds"},
    v1=Dialect(
        FORMAT_NAME,
        {
            "tar": ("file", "data"),
            "records": ("count", "records"),
            "tar_bytes": ("count", "bytes"),
            "sha256": ("sha256?", "data.sha256"),
            "crc32c": ("file?", "crc"),
        },
    ),
    shard_path=f"{_W}.writer:shard_path",
    open_shard=f"{_W}.shard:WdsShard",
)
