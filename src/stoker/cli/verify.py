"""``stoker verify FILE``: open a data set in any format exactly as the loader opens it (the
registry's reader: manifest checks, side-cars, sibling manifests, remote sizes and checksums; a
refusal is a problem), then walk it whole through the format's ``verify`` in the registry and
report every problem (exit 1 if any)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from stoker.cli._formats import add_format_argument, run_on_set
from stoker.cli._remote import add_remote_arguments, remote_options

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "report_json", "run"]


HELP = "check framing, indexes, checksums (and optionally decode every image)"
DESCRIPTION = """Open FILE exactly as the loader does (a refusal is a problem), then walk it
(a NAME.stoker.json with all its shards, a .rec/.idx, a TFRecord file, a WebDataset .tar, an
LMDB folder: any format stoker reads): the record framing, the index against the real record
boundaries, the checksums, and with --decode every image. Exit 1 listing the file, key, byte
offset and reason of each problem. FILE may be the URL of a set's manifest (RecordIO, TFRecord
or WebDataset; s3://, gs://, az://, http(s)://): each shard and its side-cars are downloaded
through the shard cache and walked as a local copy is, one shard at a time (a set larger than
--cache-limit verifies); problems name the shard's URL."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a data set: manifest, data file or database folder")
    add_format_argument(p)
    p.add_argument("--decode", action="store_true", help="also decode every image")
    p.add_argument("--no-checksums", action="store_true", help="skip the CRC32C comparison")
    p.add_argument(
        "--allow-missing-checksums",
        action="store_true",
        help="RecordIO: accept a .crc32c that the manifest names but that is missing (by "
        "default that is a problem: the records could not be checked)",
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="accept a set of 0 records (by default that is a problem: an empty TFRecord, a "
        "tar with no samples, ... is more likely a broken export than an intended set)",
    )
    p.add_argument(
        "--max-problems",
        type=int,
        default=1000,
        metavar="N",
        help="list at most N problems (all are counted; default 1000)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar; print problems only")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON on stdout (no bar; the exit status is the same)",
    )
    add_remote_arguments(p)


def report_json(report: Any, format: str) -> dict[str, Any]:
    """A verify report as JSON: the counts, every problem listed (file, key, byte offset,
    ``.idx`` line, reason) and the notes."""
    return {
        "path": report.path,
        "format": format,
        "ok": report.ok,
        "records": report.records,
        "indexed": report.indexed,
        "bytes": report.data_bytes,
        "checksummed": report.checksummed,
        "decoded": report.decoded,
        "problem_count": report.problem_count,
        "problems": [
            {
                "path": p.path,
                "key": p.key,
                "offset": p.offset,
                "idx_line": p.idx_line,
                "reason": p.reason,
                "text": str(p),
            }
            for p in report.problems
        ],
        "notes": list(report.notes),
    }


def _refusal(path: str, name: str, remote: Any, relaxed: bool) -> Any:
    """``None`` when the loader's reader opens ``path`` (``registry.open_reader``; a local
    set's keys and labels read as the loader reads them, a URL's manifest, listing and sizes
    checked without a download: the walk downloads each shard once), else its refusal as a problem naming the file, key
    and byte offset it names. ``relaxed`` (``--no-checksums``, ``--allow-missing-checksums``):
    opened with the reader's ``checksums=False``, where it has that option."""
    import inspect

    from stoker._core.errors import CacheFullError, CorruptRecordError, StokerError
    from stoker.formats import registry
    from stoker.formats.remote import remote_url
    from stoker.formats.report import Problem

    opener = registry.get(name).load("reader")
    off = (
        {"checksums": False}
        if relaxed and "checksums" in inspect.signature(opener).parameters
        else {}
    )
    try:
        with registry.open_reader(path, format=name, remote=remote, **off) as reader:
            if remote_url(path) is None:  # a URL's shards: read once, by the walk below
                reader.keys(), reader.labels()
    except CacheFullError:
        return None  # the budget's, not the set's: the walk below downloads one shard at a time
    except CorruptRecordError as e:
        return Problem(e.path, e.key, e.offset, f"the loader refuses it: {e.reason}", e.idx_line)
    except (StokerError, OSError, ValueError) as e:
        return Problem(path, None, None, f"the loader refuses to open it: {e}")
    return None


def run(args: argparse.Namespace) -> int:
    return run_on_set("verify", args, lambda name: _run(args, name))


def _run(args: argparse.Namespace, name: str) -> int:
    from stoker.formats import registry
    from stoker.formats.remote import remote_url

    decode = None
    if args.decode:
        from stoker import codecs

        decode = codecs.decode
    extra: dict[str, Any] = {}
    if args.allow_missing_checksums:  # a RecordIO option; another format refuses it by name
        extra["allow_missing_checksums"] = True
    if remote_url(args.file) is not None or registry.get(name).remote:
        extra["remote"] = remote_options(args)  # a local manifest may name URLs (allow_hosts)
    relaxed = args.no_checksums or args.allow_missing_checksums
    refusal = _refusal(args.file, name, extra.get("remote"), relaxed)
    report = registry.get(name).load("verify")(
        args.file,
        checksums=not args.no_checksums,
        decode=decode,
        max_problems=args.max_problems,
        progress=False if args.quiet or args.json else None,
        **extra,
    )
    where = None if refusal is None else (refusal.key, refusal.offset)
    said = refusal is None or any(
        p.reason in refusal.reason or (p.key, p.offset) == where != (None, None)
        for p in report.problems
    )  # the walk names it already; an empty set is the empty-set rule's
    if not said and report.records:  # first what the loader says, then the walk
        report.problem_count += 1
        report.problems[:] = [refusal, *report.problems][: report.max_problems]
    if report.records == 0 and report.ok and not args.allow_empty:
        from stoker.formats.report import Problem

        report.add(
            Problem(report.path, None, None, "0 records: an empty set (--allow-empty accepts it)")
        )
    if args.json:
        print(json.dumps(report_json(report, name), indent=1))
        return 0 if report.ok else 1
    for problem in report.problems:
        print(f"problem: {problem}")
    if report.problem_count > len(report.problems):
        print(f"... and {report.problem_count - len(report.problems)} more")
    if not args.quiet:
        for note in report.notes:
            print(f"note: {note}")
        print(report.summary())
    return 0 if report.ok else 1
