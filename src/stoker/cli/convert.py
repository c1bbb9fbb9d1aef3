"""``stoker convert SRC OUT --format FMT``: a data set in any format stoker reads → a set in any
format it writes, image bytes, labels, keys and fields untouched."""

from __future__ import annotations

import argparse

from stoker.cli._errors import input_problem, refuse
from stoker.cli._remote import add_remote_arguments, guarded, remote_options
from stoker.cli.pack import (
    add_scale_options,
    run_options,
    run_plan_steps,
    step_usage,
    writable_formats,
)

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]

#: Options a convert's plan file holds: refused beside --plan (dest, flag, default).
_PLAN_HELD = (
    ("format", "--format", None),
    ("source_format", "--from", None),
    ("shard_size", "--shard-size", None),
    ("shuffle", "--shuffle", False),
    ("seed", "--seed", 0),
    ("overwrite", "--overwrite", False),
    ("no_resume", "--no-resume", False),
    ("max_rejects", "--max-rejects", None),
    ("engine", "--engine", "local"),
    ("cache_dir", "--cache-dir", None),
    ("cache_limit", "--cache-limit", None),
)


HELP = "convert a data set between formats (RecordIO, TFRecord, WebDataset, LMDB)"
DESCRIPTION = """Copy every sample of SRC (a .rec with or without its manifest, MXNet and
insightface sets included; TFRecord files; WebDataset .tar shards; an LMDB folder; any
*.stoker.json manifest) into OUT in --format: the original image bytes, labels, keys and
fields, in the source's order. Like pack: workers, progress, --shard-size, OUT.rejects.tsv (a
record that fails to read, with its key, file and byte offset), OUT's folder created when
missing, outputs renamed into place only at the end, and an interrupted run resumes. SRC may be
the URL of a RecordIO set's manifest (s3://, gs://, az://, http(s)://): its shards are read
through the shard cache. OUT may be a URL: staged locally, uploaded, manifest last. As for
pack: --engine ray, and the steps --plan-only, --plan PLAN --shards A:B, --plan PLAN --finalize
(docs/scale.md)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from stoker.formats.registry import FORMATS

    p.add_argument(
        "src",
        nargs="?",
        help="the data set to read: a file, a folder, a manifest or a manifest's URL",
    )
    p.add_argument(
        "out",
        nargs="?",
        help="output prefix, e.g. data/train (writes data/train.tar, ...), or its URL",
    )
    p.add_argument(
        "--format",
        default=None,
        choices=writable_formats(),
        help="the format to write (required, except beside --plan)",
    )
    p.add_argument(
        "--from",
        dest="source_format",
        default=None,
        choices=sorted(FORMATS),
        help="the source's format, when its path does not tell",
    )
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--shard-size", type=int, default=None, metavar="N", help="samples per shard")
    p.add_argument("--shuffle", action="store_true", help="seeded random order")
    p.add_argument("--seed", type=int, default=0, help="seed for --shuffle (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    p.add_argument("--no-resume", action="store_true", help="start over, ignoring partial output")
    p.add_argument(
        "--max-rejects",
        type=int,
        default=None,
        metavar="N",
        help="fail (exit 1) when more than N records cannot be read",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    p.add_argument(
        "--json", action="store_true", help="print the report as JSON on stdout (no bar)"
    )
    add_scale_options(p, "convert")
    add_remote_arguments(p)


def run(args: argparse.Namespace) -> int:
    return guarded("convert", args, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    bad = step_usage(args, _PLAN_HELD)
    if bad is None and args.plan is None and args.format is None:
        bad = "--format is required: the format to write"
    if bad is None and args.plan is None:
        given = args.source_format is not None
        problem = input_problem(args.src, "SRC", detect=not given, format_option="--from")
        if problem is not None:  # the exit status of a source the converter refuses
            return refuse("convert", problem, 1)
    if bad:
        return refuse("convert", bad)
    if args.plan is not None and not args.plan_only:
        return run_plan_steps(args, "convert")
    remote = remote_options(args)  # a URL's, or a local manifest's naming URLs (allow_hosts)
    return run_options(
        args,
        "convert",
        src=args.src,
        out=args.out,
        workers=args.workers,
        shuffle=args.shuffle,
        seed=args.seed,
        shard_size=args.shard_size,
        overwrite=args.overwrite,
        resume=not args.no_resume,
        max_rejects=args.max_rejects,
        progress=False if args.quiet or args.json else None,
        format=args.format,
        convert=True,
        source_format=args.source_format,
        # how the source's URL is reached and cached (its repr names no credential)
        source_options={"remote": remote} if remote is not None else None,
        engine=args.engine,
        ray_address=args.address,
    )
