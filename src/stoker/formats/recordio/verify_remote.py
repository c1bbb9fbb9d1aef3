"""Verification of a RecordIO set in object storage, by its manifest's URL (what ``stoker verify
s3://...`` runs): every shard downloaded afresh and walked as a local shard is.

A copy already in the node's shard cache is not trusted to be what storage holds now (the
object may have changed since it was cached), so each shard is downloaded again: through a
:class:`~stoker.storage.ShardCache` of its own, a folder ``verify-PID-RAND`` inside the cache
folder with the cache's budget, which holds one shard at a time (emptied after each, removed at
the end; one a killed run left is removed by the next). So a set larger than the budget
verifies, and the downloads are checked and atomic as every cache download is: against the
manifest's size and, where it records one, the whole file's CRC32C (``rec_crc32c``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import replace

from stoker._core.checksum import file_crc32c
from stoker._core.errors import CorruptRecordError
from stoker.formats.manifest import read_json
from stoker.formats.recordio.manifest import validate_manifest
from stoker.formats.recordio.verify import _Options, _verify_entry, _with_schema
from stoker.formats.remote import RemoteFiles, RemoteOptions
from stoker.formats.report import Problem, VerifyReport
from stoker.storage.cache import Pin
from stoker.storage.urls import redact

__all__ = ["verify_remote"]


def verify_remote(
    url: str,
    *,
    remote: RemoteOptions | None = None,
    checksums: bool = True,
    decode: Callable[[bytes], object] | None = None,
    max_problems: int = 1000,
    progress: bool | None = None,
    allow_missing_checksums: bool = False,
) -> VerifyReport:
    """Verify a RecordIO set in object storage by its manifest's URL (``remote``: how to reach
    it, and the cache folder and budget to download through; see the module docstring).

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
    options = remote or RemoteOptions()
    base = options.cache()
    root = os.path.join(base.root, f"verify-{os.getpid()}-{secrets.token_hex(4)}")
    _sweep(base.root)
    try:
        files = RemoteFiles(url, replace(options, cache_dir=root, cache_limit=base.limit))
        return _verify(files, checksums, decode, max_problems, progress, allow_missing_checksums)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _sweep(folder: str) -> None:
    """Remove the ``verify-PID-*`` folders of processes that are gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            parts = name.split("-")
            if len(parts) != 3 or parts[0] != "verify" or not parts[1].isdigit():
                continue
            try:
                os.kill(int(parts[1]), 0)
            except ProcessLookupError:
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            except OSError:
                pass  # alive, another user's


def _verify(
    files: RemoteFiles,
    checksums: bool,
    decode: Callable[[bytes], object] | None,
    max_problems: int,
    progress: bool | None,
    allow_missing_checksums: bool,
) -> VerifyReport:
    shown = redact(files.url)
    report = VerifyReport(shown, max_problems=max_problems)
    manifest = validate_manifest(read_json(files.manifest_copy()), shown)
    opts = _with_schema(
        _Options(checksums, decode, progress, allow_missing_checksums), manifest, shown
    )
    urls = [
        tuple(
            files.url_of(e[f], f"shards[{j}].{f}") if e.get(f) else None
            for f in ("rec", "idx", "crc32c")
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
    entry: dict,
    urls: tuple[str, str, str | None],
    opts: _Options,
) -> None:
    """Shard ``j``: fetched through the cache, walked, its pins released."""
    rec, idx, crc = urls
    what = f"shard {j} ({entry['rec']})"
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
    _relabel(report, n0, m0, names)


def _fetch_rec(
    report: VerifyReport, files: RemoteFiles, entry: dict, rec: str, what: str, checksums: bool
) -> Pin:
    """The pinned cached copy of a shard's ``.rec``, checked against ``rec_crc32c``; one that
    fails the check is a problem and is fetched again unchecked (to be walked)."""
    want = entry.get("rec_crc32c") if checksums else None
    if files.sizes[rec] != entry["rec_bytes"]:
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
            f"the object's CRC32C is 0x{file_crc32c(pin.path):08x}, the manifest's rec_crc32c "
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


def _relabel(report: VerifyReport, n0: int, m0: int, names: dict[str, str]) -> None:
    """The problems and notes from ``n0``/``m0`` on with each cached copy's path replaced by
    the URL it was fetched from."""

    def sub(text: str) -> str:
        for local, url in names.items():
            text = text.replace(local, url)
        return text

    report.problems[n0:] = [
        replace(p, path=sub(p.path), reason=sub(p.reason)) for p in report.problems[n0:]
    ]
    report.notes[m0:] = [sub(n) for n in report.notes[m0:]]
