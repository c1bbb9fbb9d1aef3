"""TFRecord files of ``tf.train.Example`` records, read and written without TensorFlow.

The registry's line names ``open_reader``, ``open_writer``, ``write_set_manifest`` and
``verify`` here. The byte layout, the index cache, the features read and written and the GZIP
policy are in this folder's README.md.
"""

from __future__ import annotations

import os
from typing import Any

from stoker.formats.shards import MAX_OPEN_SHARDS
from stoker.formats.spec import Dialect, Format
from stoker.formats.tfrecord.example import encode_example, parse_features
from stoker.formats.tfrecord.features import feature_names, image_hw
from stoker.formats.tfrecord.framing import frame, mask_crc, masked_crc
from stoker.formats.tfrecord.reader import TFRecordReader
from stoker.formats.tfrecord.verify import verify
from stoker.formats.tfrecord.writer import (
    TFRecordShardWriter,
    open_writer,
    shard_path,
    write_set_manifest,
)

__all__ = [
    "FORMAT",
    "MAX_OPEN_SHARDS",
    "TFRecordReader",
    "TFRecordShardWriter",
    "encode_example",
    "feature_names",
    "frame",
    "image_hw",
    "mask_crc",
    "masked_crc",
    "open_reader",
    "open_writer",
    "parse_features",
    "shard_path",
    "verify",
    "write_set_manifest",
]

_T = "stoker.formats.tfrecord"
#: The format, as the registry lists it (:mod:`stoker.formats.spec`).
FORMAT = Format(
    "tfrecord",
    f"{_T}:open_reader",
    (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz"),
    writer=f"{_T}:open_writer",
    manifest=f"{_T}:write_set_manifest",
    verify=f"{_T}:verify",
    remote=True,
    roles={"data": ".tfrecord"},
    options=f"{_T}.features:check_options",
    v1=Dialect(
        "stoker-tfrecord",
        {"path": ("file", "data"), "records": ("count", "records"), "bytes": ("count", "bytes")},
        options=("features", "key_feature"),
    ),
    shard_path=f"{_T}.writer:shard_path",
    open_shard=f"{_T}.shard:TFRecordShard",
)


def open_reader(path: str | os.PathLike[str], **options: Any) -> TFRecordReader:
    """The registry's reader: a ``.tfrecord`` file or a TFRecord set's manifest; the
    options are :class:`TFRecordReader`'s."""
    return TFRecordReader(path, **options)
