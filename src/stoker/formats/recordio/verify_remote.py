"""Verification of a RecordIO set in object storage, by its manifest's URL (what ``stoker verify
s3://...`` runs): every shard downloaded afresh and walked as a local shard is.

Each shard is downloaded again, through a shard cache of its own that holds one shard at a
time (:mod:`stoker.formats.verify_remote`, which every format's remote verify shares), and
checked against the manifest's size and, where it records one, the whole file's CRC32C
(``rec_crc32c``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from stoker._core.checksum import file_crc32c
from stoker._core.errors import CorruptRecordError
from stoker.formats.manifest import parse, read_json
from stoker.formats.recordio.manifest import KIND
from stoker.formats.recordio.verify import _Options, _verify_entry, _with_schema
from stoker.formats.remote import RemoteFiles, RemoteOptions
from stoker.formats.report import Problem, VerifyReport
from stoker.formats.shards import ShardEntry
from stoker.formats.verify_remote import fresh_files, relabel
from stoker.storage.cache import Pin
from stoker.storage.urls import redact

__all__ = ["verify_remote"]


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
    CRC32C differs from ``rec_crc32c`` is a problem; it is then fetched unchecked and walked,
    so the records that changed are named (key, byte offset, ``.idx`` line) where the set has
    per-record checksums.

    Raises what stops the whole walk: an unreadable or hostile manifest, storage that cannot be
    reached, a shard larger than the cache's budget (:class:`CacheFullError`).
    """
    if max_problems < 0:
        raise ValueError(f"max_problems must be >= 0, got {max_problems}")
    opts = _Options(**options)
    with fresh_files(url, remote) as files:
        return _verify(files, opts, max_problems)


def _verify(files: RemoteFiles, options: _Options, max_problems: int) -> VerifyReport:
    shown = redact(files.url)
    report = VerifyReport(shown, max_problems=max_problems)
    manifest = parse(read_json(files.manifest_copy()), shown, KIND)
    opts = _with_schema(options, manifest, shown)
    urls = [
        tuple(
            files.url_of(e.files[role], f"shards[{j}].files.{role}") if role in e.files else None
            for role in ("data", "index", "crc")
        )
        for j, e in enumerate(manifest["shards"])
    ]
    # files.sizes: what exists (one listing per folder, or a HEAD each over HTTP)
    files.sizes.update(
        files.remote.sizes([u for trio in urls for u in trio if u is not None], missing_ok=True)
    )
    for j, (entry, trio) in enumerate(zip(manifest["shards"], urls, strict=True)):
        _verify_remote_entry(report, files, j, entry, trio, opts)  # type: ignore[arg-type]
        files.cache.clear()  # one shard at a time
    return report


def _verify_remote_entry(
    report: VerifyReport,
    files: RemoteFiles,
    j: int,
    entry: ShardEntry,
    urls: tuple[str, str, str | None],
    opts: _Options,
) -> None:
    """Shard ``j``: fetched through the cache, walked, its pins released."""
    rec, idx, crc = urls
    what = f"shard {j} ({entry.files['data']})"
    if rec not in files.sizes:
        report.add(Problem(redact(rec), None, None, "shard listed in the manifest is missing"))
        return
    pins: list[Pin] = []
    names: dict[str, str] = {}
    n0, m0 = len(report.problems), len(report.notes)
    try:
        pins.append(_fetch_rec(report, files, entry, rec, what, opts.checksums))
        names[pins[-1].path] = redact(rec)
        idx_local = None
        if idx in files.sizes:
            pins.append(files.fetch(idx, what=what))
            idx_local = pins[-1].path
            names[idx_local] = redact(idx)
        else:
            report.add(Problem(redact(idx), None, None, "the .idx file does not exist"))
        crc_local, opts = _fetch_crc(report, files, rec, crc, what, opts, pins)
        if crc_local is not None:
            names[crc_local] = redact(crc or "")
        _verify_entry(
            report, entry, pins[0].path, idx_local, crc_local, opts, rec.rsplit("/", 1)[-1]
        )
    finally:
        for pin in pins:
            pin.close()
    relabel(report, n0, m0, names)


def _fetch_rec(
    report: VerifyReport,
    files: RemoteFiles,
    entry: ShardEntry,
    rec: str,
    what: str,
    checksums: bool,
) -> Pin:
    """The pinned cached copy of a shard's ``.rec``, checked against its recorded CRC32C; one
    that fails the check is a problem and is fetched again unchecked (to be walked)."""
    got = entry.checksums.get("data.crc32c") if checksums else None
    want = None if got is None else int(got)
    if files.sizes[rec] != entry.bytes:
        want = None  # the size problem is reported by the walk; the CRC cannot match
    try:
        return files.fetch(rec, crc32c=want, what=what)
    except CorruptRecordError:
        if want is None:
            raise
    pin = files.fetch(rec, crc32c=None, what=what)
    report.add(
        Problem(
            redact(rec),
            None,
            None,
            f"the object's CRC32C is 0x{file_crc32c(pin.path):08x}, the manifest's data.crc32c "
            f"0x{want:08x}: the shard changed after the set was written",
        )
    )
    return pin


def _fetch_crc(
    report: VerifyReport,
    files: RemoteFiles,
    rec: str,
    crc: str | None,
    what: str,
    opts: _Options,
    pins: list[Pin],
) -> tuple[str | None, _Options]:
    """The cached copy of the shard's checksum file (pinned into ``pins``) and the options
    to walk with: without checksums when the manifest names none, or one that is missing."""
    if not opts.checksums:
        return None, opts
    if crc is None:
        report.notes.append(f"{redact(rec)}: no checksum file (the manifest names none)")
        return None, replace(opts, checksums=False)
    if crc not in files.sizes:
        if opts.allow_missing_checksums:
            report.notes.append(f"{redact(rec)}: its checksum file {redact(crc)} is missing")
        else:
            report.add(
                Problem(
                    redact(crc),
                    None,
                    None,
                    f"the checksum file the manifest names for {redact(rec)} does not exist, "
                    "so its records cannot be checked (--allow-missing-checksums to accept that)",
                )
            )
        return None, replace(opts, checksums=False)
    pins.append(files.fetch(crc, what=what))
    return pins[-1].path, opts
