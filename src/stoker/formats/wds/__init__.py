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

from stoker.formats.spec import Format
from stoker.formats.wds.layout import IMAGE_SUFFIXES, LABEL_SUFFIX, field_suffixes, split_name
from stoker.formats.wds.manifest import FORMAT_NAME, load_manifest, validate_manifest
from stoker.formats.wds.reader import MAX_OPEN_SHARDS, WdsReader, open_reader
from stoker.formats.wds.tarfmt import TarError, checksum, ustar_header
from stoker.formats.wds.verify import verify
from stoker.formats.wds.writer import WdsShardWriter, open_writer, shard_path, write_set_manifest

__all__ = [
    "FORMAT",
    "FORMAT_NAME",
    "IMAGE_SUFFIXES",
    "LABEL_SUFFIX",
    "MAX_OPEN_SHARDS",
    "TarError",
    "WdsReader",
    "WdsShardWriter",
    "checksum",
    "field_suffixes",
    "load_manifest",
    "open_reader",
    "open_writer",
    "shard_path",
    "split_name",
    "ustar_header",
    "validate_manifest",
    "verify",
    "write_set_manifest",
]

_W = "stoker.formats.wds"
#: The format, as the registry lists it (:mod:`stoker.formats.spec`).
FORMAT = Format(
    "wds",
    f"{_W}:open_reader",
    (".tar",),
    FORMAT_NAME,
    f"{_W}:open_writer",
    f"{_W}:write_set_manifest",
    f"{_W}:verify",
    remote=True,
    roles={"data": ".tar", "crc": ".crc32c"},
    shard_path=f"{_W}.writer:shard_path",
    open_shard=f"{_W}.shard:open_shard",
)
