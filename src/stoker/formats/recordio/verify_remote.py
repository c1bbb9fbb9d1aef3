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
from stoker.formats.remote import RemoteOptions, local_path, remote_url
from stoker.formats.report import VerifyReport
from stoker.formats.shards import ShardEntry
from stoker.formats.verify_remote import verify_shards
from stoker.storage.urls import redact

__all__ = ["verify", "verify_remote"]


def verify(
    path: str | os.PathLike[str],
    *,
    idx_path: str | os.PathLike[str] | None = None,
    remote: RemoteOptions | None = None,
    **kw: Any,
) -> VerifyReport:
    """The registry's ``verify``: :func:`~stoker.formats.recordio.verify_records` on ``path``
    (an ``.idx`` is verified with the ``.rec`` beside it), with its options ``kw``
    (``checksums``, ``decode``, ``max_problems``, ``progress``, ``allow_missing_checksums``); a
    manifest's URL is verified shard by shard through the shard cache (``remote``: how to
    reach and cache it; :func:`verify_remote`)."""
    url = remote_url(os.fspath(path))
    if url is None:
        return verify_records(local_path(os.fspath(path)), idx_path=idx_path, **kw)
    if idx_path is not None:
        raise ValueError("idx_path is for a local .rec; a set in object storage has a manifest")
    return verify_remote(url, remote=remote, **kw)


def verify_remote(
    url: str,
    *,
    remote: RemoteOptions | None = None,
    max_problems: int = 1000,
    **options: Any,
) -> VerifyReport:
    """Verify a RecordIO set in object storage by its manifest's URL (``remote``: how to reach
    it, and the cache folder and budget to download through; see the module docstring), with
    :func:`~stoker.formats.recordio.verify_records`' ``options`` (``checksums``, ``decode``,
    ``progress``, ``allow_missing_checksums``).

    Each shard's ``.rec``, ``.idx`` and checksum file are downloaded and walked as
    :func:`~stoker.formats.recordio.verify_records` walks a local shard, one shard at a time.
    Problems name the shard's URL (without credentials), never a local copy. A shard whose
    CRC32C differs from its ``data.crc32c`` is a problem, and it is walked, so the records
    that changed are named (key, byte offset, ``.idx`` line) where the set has per-record
    checksums.

    Raises what stops the whole walk: an unreadable or hostile manifest, storage that cannot be
    reached, a shard larger than the cache's budget (:class:`CacheFullError`).
    """
    opts = _Options(**options)

    def entry(report: VerifyReport, local: dict[str, str], s: ShardEntry, m: dict) -> None:
        rec, idx = local["data"], local.get("index")
        name = os.path.basename(s.files["data"])
        _verify_entry(
            report, s, rec, idx, local.get("crc"), _with_schema(opts, m, redact(url)), name
        )

    return verify_shards(
        url, remote=remote, kind=KIND, verify_entry=entry, max_problems=max_problems
    )
