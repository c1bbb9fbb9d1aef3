"""``stoker cleanup``: remove named shared-memory segments left by loaders whose process died.

A loader's batch ring and a folder's listing are anonymous (memfd) and vanish with their
processes; what can be left is an array source's copy, or a ring of an older stoker."""

from __future__ import annotations

import argparse
import json

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]


HELP = "remove /dev/shm/stoker_* segments whose owner process is dead"
DESCRIPTION = """Remove /dev/shm/stoker_* segments left behind by a loader whose process was
killed (SIGKILL, OOM killer, a scheduler's killpg): an in-memory array source's copy, or the
batch ring of an older stoker (rings are anonymous now and vanish with their processes).
Segments of running processes are kept. Loaders also do this sweep when they start."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="list what would be removed")
    p.add_argument(
        "--json",
        action="store_true",
        help='print {"dry_run", "removed": [paths], "count"} as JSON on stdout',
    )


def run(args: argparse.Namespace) -> int:
    from stoker.loader import cleanup_stale

    removed = cleanup_stale(dry_run=args.dry_run)
    if args.json:
        paths = [f"/dev/shm/{name}" for name in removed]
        out = {"dry_run": bool(args.dry_run), "removed": paths, "count": len(paths)}
        print(json.dumps(out, indent=1))
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for name in removed:
        print(f"{verb} /dev/shm/{name}")
    print(f"{verb} {len(removed)} stale segment(s)")
    return 0
