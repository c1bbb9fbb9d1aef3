"""``stoker verify FILE``: walk a whole record file and report every problem (exit 1 if any)."""

from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help="check framing, .idx, checksums (and optionally decode every image)",
        description=(
            "Walk FILE (.rec, .idx or NAME.stoker.json with all its shards): record framing, the "
            ".idx against the real record boundaries, CRC32C against the side file, and with "
            "--decode every image. Exit 1 listing the key, byte offset and reason of each problem."
        ),
    )
    p.add_argument("file", help=".rec, .idx or .stoker.json")
    p.add_argument("--decode", action="store_true", help="also decode every image")
    p.add_argument("--no-checksums", action="store_true", help="skip the CRC32C comparison")
    p.add_argument(
        "--allow-missing-checksums",
        action="store_true",
        help="accept a .crc32c that the manifest names but that is missing (by default that "
        "is a problem: the records could not be checked)",
    )
    p.add_argument(
        "--max-problems",
        type=int,
        default=1000,
        metavar="N",
        help="list at most N problems (all are counted; default 1000)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar; print problems only")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from stoker.formats.recordio import verify_records

    path = args.file
    if path.endswith(".idx"):
        path = path[:-4] + ".rec"
    decode = None
    if args.decode:
        from stoker import codecs

        decode = codecs.decode
    report = verify_records(
        path,
        checksums=not args.no_checksums,
        decode=decode,
        max_problems=args.max_problems,
        progress=False if args.quiet else None,
        allow_missing_checksums=args.allow_missing_checksums,
    )
    for problem in report.problems:
        print(f"problem: {problem}", file=sys.stdout)
    if report.problem_count > len(report.problems):
        print(f"... and {report.problem_count - len(report.problems)} more", file=sys.stdout)
    if not args.quiet:
        for note in report.notes:
            print(f"note: {note}")
        print(report.summary())
    return 0 if report.ok else 1
