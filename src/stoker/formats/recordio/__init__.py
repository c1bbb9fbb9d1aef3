"""MXNet/dmlc-compatible RecordIO: reader, atomic/resumable writer, manifest, verifier.

See ``README.md`` in this folder (and ``docs/format.md``) for the byte layout.

- ``stoker.formats.open(path)`` reads a ``.rec``, its ``.idx`` or a ``NAME.stoker.json``
  manifest (several shards read as one, each checked against its entry) as the sample-level
  ``RecordIOReader`` (``seam.py``), a ``ShardedReader`` of ``RecordIOShard`` (``shard.py``);
  :class:`RecordFile` reads one ``.rec`` by position. :func:`open_records` (deprecated) gives
  the same reader.
- :class:`RecordWriter` writes ``.rec`` + ``.idx`` (+ ``.crc32c``) atomically and resumes
  after a killed run.
- :func:`verify_records` walks a whole file and reports every problem.
"""

from __future__ import annotations

from stoker.formats.recordio.framing import (
    MAGIC,
    MAX_RECORD_BYTES,
    frame_record,
    iter_records,
    scan_offsets,
)
from stoker.formats.recordio.header import IR_SIZE, IRHeader, pack_header, unpack_header
from stoker.formats.recordio.index import IndexTable, load_index, parse_idx
from stoker.formats.recordio.insightface import IDENTITY_TABLE
from stoker.formats.recordio.manifest import (
    MANIFEST_SUFFIX,
    load_manifest,
    make_manifest,
    shard_entry,
    validate_manifest,
    write_manifest,
)
from stoker.formats.recordio.paths import default_crc_path, default_idx_path, manifest_path_for
from stoker.formats.recordio.reader import RecordFile
from stoker.formats.recordio.seam import open_records
from stoker.formats.recordio.verify import Problem, VerifyReport, verify_records
from stoker.formats.recordio.writer import RecordWriter, ShardInfo
from stoker.formats.spec import Dialect, Format

_R = "stoker.formats.recordio"
#: The format, as the registry lists it (:mod:`stoker.formats.spec`).
FORMAT = Format(
    "recordio",
    f"{_R}.seam:open_reader",
    (".rec", ".idx"),
    writer=f"{_R}.shardwriter:open_writer",
    manifest=f"{_R}.shardwriter:write_set_manifest",
    verify=f"{_R}.verify_remote:verify",
    remote=True,
    roles={"data": ".rec", "index": ".idx", "crc": ".crc32c"},
    required=("data", "index"),
    checksums=("index.sha256",),
    v1=Dialect(
        "stoker-recordio",
        {
            "rec": ("file", "data"),
            "idx": ("file", "index"),
            "records": ("count", "records"),
            "rec_bytes": ("count", "bytes"),
            "idx_sha256": ("sha256", "index.sha256"),
            "crc32c": ("file?", "crc"),
            "rec_crc32c": ("u32?", "data.crc32c"),
        },
    ),
    shard_path=f"{_R}.shardwriter:shard_path",
    open_shard=f"{_R}.shard:RecordIOShard",
)

__all__ = [
    "FORMAT",
    "IDENTITY_TABLE",
    "IR_SIZE",
    "MAGIC",
    "MANIFEST_SUFFIX",
    "MAX_RECORD_BYTES",
    "IRHeader",
    "IndexTable",
    "Problem",
    "RecordFile",
    "RecordWriter",
    "ShardInfo",
    "VerifyReport",
    "default_crc_path",
    "default_idx_path",
    "frame_record",
    "iter_records",
    "load_index",
    "load_manifest",
    "make_manifest",
    "manifest_path_for",
    "open_records",
    "pack_header",
    "parse_idx",
    "scan_offsets",
    "shard_entry",
    "unpack_header",
    "validate_manifest",
    "verify_records",
    "write_manifest",
]
