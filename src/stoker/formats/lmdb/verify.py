"""``verify``: walk every value of an LMDB database and report each one that is not what the
database's layout says (``stoker verify`` runs it).

A Datum database: every value must parse as a Datum whose raw pixels match ``channels x height
x width``, or whose encoded data starts like an image file. An image database: every value must
start like an image file. Either way every key the cursor lists must be found by a lookup, as a
reader finds it (a damaged branch page misleads lookups only). ``decode`` (a callable that
raises on a bad image, e.g. ``stoker.codecs.decode``) is applied to every encoded image. LMDB
keeps no per-record checksums, so ``checksums`` has nothing to compare (a note says so).
Damaged pages are found before the walk, when the database is opened (:mod:`.guard`): one
problem naming the data file; an error liblmdb reports during the walk names the position the
walk had reached.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from stoker._core.errors import CorruptRecordError
from stoker._core.progress import make_progress
from stoker.formats.lmdb.env import EnvHandle
from stoker.formats.lmdb.location import (
    LmdbFormatError,
    import_lmdb,
    locate,
    not_found,
    show_key,
)
from stoker.formats.lmdb.values import check_layout, check_value, detect_layout
from stoker.formats.report import Problem, VerifyReport

__all__ = ["verify"]


def _problem(report: VerifyReport, e: LmdbFormatError) -> None:
    report.add(Problem(e.path, e.position, None, e.detail()))


def verify(
    path: str | os.PathLike[str],
    *,
    checksums: bool = True,
    decode: Callable[[bytes], object] | None = None,
    max_problems: int = 1000,
    progress: bool | None = None,
    layout: str | None = None,
) -> VerifyReport:
    """Check every value of the database at ``path`` (see the module docstring). Problems in
    the data go into the report, never raised; a missing path raises ``FileNotFoundError``."""
    if max_problems < 0:
        raise ValueError(f"max_problems must be >= 0, got {max_problems}")
    layout = check_layout(layout)
    p = os.fspath(path)
    report = VerifyReport(p, max_problems=max_problems)
    lmdb = import_lmdb()
    try:
        handle = EnvHandle(locate(p))
        env = handle.get()
    except LmdbFormatError as e:
        _problem(report, e)
        return report
    except CorruptRecordError as e:  # damaged pages, found before the file was mapped
        report.add(Problem(e.path, e.key, e.offset, e.reason))
        return report
    if checksums:
        report.notes.append(f"{p}: LMDB stores no per-record checksums; every value was parsed")
    try:
        _walk(report, env, p, layout, decode, progress, lmdb)
    finally:
        handle.close()
    return report


def _walk(report, env, p, layout, decode, progress, lmdb) -> None:  # noqa: ANN001
    entries = int(env.stat()["entries"])
    report.indexed = entries
    if entries == 0:
        report.add(Problem(p, None, None, "the database has 0 records"))
        return
    bar = make_progress(entries, f"verify {os.path.basename(p.rstrip(os.sep))}", enabled=progress)
    i = 0
    try:
        with env.begin(buffers=True) as txn:
            for k, v in txn.cursor().iternext(keys=True, values=True):
                key = bytes(k)
                report.records += 1
                report.data_bytes += len(v)
                try:
                    if layout is None:
                        layout = detect_layout(v, p, key)
                    encoded = check_value(layout, v, p, key, i)
                    if encoded is not None and decode is not None:
                        _decode(report, decode, encoded, p, key, i)
                except LmdbFormatError as e:
                    _problem(
                        report, LmdbFormatError(p, e.reason, key=key, position=i, offset=e.offset)
                    )
                if txn.get(key) is None:  # a reader looks keys up: a damaged branch misleads it
                    _problem(report, not_found(p, key, i))
                i += 1
                bar.update(1)
    except lmdb.Error as e:
        report.add(Problem(p, i, None, f"LMDB error at position {i} of the walk: {e}"))
    finally:
        bar.close()
    if report.records != entries:
        report.add(
            Problem(
                p, None, None, f"the walk found {report.records} records, LMDB counts {entries}"
            )
        )


def _decode(report: VerifyReport, decode, buf, p: str, key: bytes, i: int) -> None:  # noqa: ANN001
    report.decoded += 1
    try:
        decode(bytes(buf))
    except Exception as e:  # noqa: BLE001 - any decoder failure is a finding
        reason = f"the image does not decode: {type(e).__name__}: {e}"
        report.add(Problem(p, i, None, f"LMDB key {show_key(key)}, position {i}: {reason}"))
