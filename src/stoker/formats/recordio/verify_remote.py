"""The registry's ``verify`` of RecordIO (:func:`verify`: a local set walked by
:func:`~stoker.formats.recordio.verify_records`), and the verification of a set in object
storage by its manifest's URL (what ``stoker verify s3://...`` runs): every shard downloaded
afresh and walked as a local shard is.

Each shard is downloaded again, through a shard cache of its own that holds one shard at a
time (:mod:`stoker.formats.verify_remote`, which every format's remote verify shares), and
walked as a local copy is (the manifest's size and whole-file CRC32C, every record).
"""

from __future__ import annotations

import os
from typing import Any

from stoker.formats.recordio.manifest import KIND
from stoker.formats.recordio.verify import _Options, _verify_entry, _with_schema, verify_records
from stoker.formats.report import VerifyReport
from stoker.formats.shards import ShardEntry
from stoker.formats.verify_remote import RemoteOptions, verify_at

__all__ = ["verify"]


def verify(
    path: str | os.PathLike[str],
    *,
    idx_path: str | os.PathLike[str] | None = None,
    remote: RemoteOptions | None = None,
    max_problems: int = 1000,
    **kw: Any,
) -> VerifyReport:
    """The registry's ``verify``: :func:`~stoker.formats.recordio.verify_records` on ``path``
    (an ``.idx`` is verified with the ``.rec`` beside it), with its options ``kw``
    (``checksums``, ``decode``, ``progress``, ``allow_missing_checksums``). A manifest's URL
    (``remote``: how to reach it, and the cache folder and budget to download through) is
    walked shard by shard: each shard's ``.rec``, ``.idx`` and checksum file downloaded and
    walked as a local shard is. Problems name the shard's URL (without credentials), never a
    local copy; a shard whose CRC32C differs from its ``data.crc32c`` is a problem, and it is
    walked, so the records that changed are named. Raises what stops the whole walk: an
    unreadable or hostile manifest, storage that cannot be reached, a shard larger than the
    cache's budget (:class:`CacheFullError`)."""
    opts = _Options(**kw)

    def entry(report: VerifyReport, local: dict[str, str], s: ShardEntry, m: dict) -> None:
        rec, idx = local["data"], local.get("index")
        name = os.path.basename(s.files["data"])
        options = _with_schema(opts, m, report.path)
        _verify_entry(report, s, rec, idx, local.get("crc"), options, name)

    def walk(p: str) -> VerifyReport:
        return verify_records(p, idx_path=idx_path, max_problems=max_problems, **kw)

    why = "idx_path is for a local .rec; a set in object storage has a manifest"
    return verify_at(
        path,
        KIND,
        local=walk,
        entry=entry,
        max_problems=max_problems,
        remote=remote,
        local_only=why if idx_path is not None else "",
    )
