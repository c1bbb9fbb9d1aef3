"""``stoker pack SRC OUT``: an image folder, im2rec list or ``.jsonl``/``.csv`` listing →
shards of a format (RecordIO by default, TFRecord, WebDataset) + manifest."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

__all__ = ["add_parser", "make_options", "run", "run_options", "writable_formats"]


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help="pack an image folder, an im2rec .lst or a .jsonl/.csv listing into RecordIO "
        "(or TFRecord, WebDataset) shards",
        description=(
            "Pack SRC (an image folder with one class per top-level subfolder, an im2rec "
            ".lst file, or a .jsonl/.csv listing of images with fields: label, boxes, text, "
            "masks...; see docs/pack.md) into OUT.rec/OUT.idx (OUT-NNNNN.* with --shard-size), "
            "OUT.crc32c, OUT.stoker.json and OUT.rejects.tsv (--format tfrecord: OUT.tfrecord; "
            "--format wds: OUT.tar, WebDataset). Original JPEG bytes are kept "
            "unless --resize or --quality asks for a re-encode. OUT's folder is created when "
            "missing. An interrupted run resumes."
        ),
    )
    p.add_argument("src", help="image folder, an im2rec .lst file, or a .jsonl/.csv listing")
    p.add_argument("out", help="output prefix, e.g. data/train (writes data/train.rec, ...)")
    p.add_argument(
        "--format",
        default="recordio",
        choices=writable_formats(),
        help="what to write (default: recordio)",
    )
    p.add_argument(
        "--labels",
        default="folders",
        choices=("folders", "none"),
        help="a folder's labels: one class per top-level subfolder (default; a folder of "
        "images without subfolders is refused), or none (every record 0, no class names)",
    )
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--resize", type=int, default=None, metavar="S", help="shorter side in pixels")
    p.add_argument(
        "--quality", type=int, default=None, metavar="Q", help="JPEG quality (re-encodes)"
    )
    p.add_argument("--shuffle", action="store_true", help="seeded random record order")
    p.add_argument("--seed", type=int, default=0, help="seed for --shuffle (default 0)")
    p.add_argument("--shard-size", type=int, default=None, metavar="N", help="images per shard")
    p.add_argument("--list", action="store_true", help="also write an im2rec-compatible OUT.lst")
    p.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    p.add_argument("--no-resume", action="store_true", help="start over, ignoring partial output")
    p.add_argument(
        "--max-rejects",
        type=int,
        default=None,
        metavar="N",
        help="fail (exit 1) when more than N files are rejected",
    )
    p.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        metavar="N",
        help="reject images whose header gives more pixels "
        "(default: Pillow's decompression-bomb limit, 89478485)",
    )
    p.add_argument("--follow-symlinks", action="store_true", help="follow symlinked folders")
    p.add_argument(
        "--root", default=None, help="folder that .lst and listing paths are relative to"
    )
    p.add_argument(
        "--schema",
        default=None,
        metavar="FILE.json",
        help="a listing's schema (Schema.to_json layout) in place of the one its rows imply",
    )
    p.add_argument(
        "--allow-outside-root",
        action="store_true",
        help="pack .lst entries that are absolute or lead outside --root "
        "(default: rejected outside_root)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    p.add_argument(
        "--json", action="store_true", help="print the report as JSON on stdout (no bar)"
    )
    p.set_defaults(func=run)
    return p


def make_options(what: str, **options: Any) -> Any:
    """``PackOptions(**options)``, or ``None`` after one line on stderr naming the bad option
    (a value no flag's type caught, such as ``--seed -1``)."""
    from stoker.pack import PackOptions

    try:
        return PackOptions(**options)
    except (TypeError, ValueError) as e:
        print(f"stoker {what}: error: {e}", file=sys.stderr)
        return None


def writable_formats() -> list[str]:
    """The registry's formats that have a writer (the registry imports nothing heavy)."""
    from stoker.formats.registry import FORMATS

    return [name for name, fmt in FORMATS.items() if fmt.writer is not None]


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_options(options: Any, args: argparse.Namespace, what: str) -> int:
    """Run a pack or convert with SIGTERM as a clean stop; print the summary (or JSON)."""
    from stoker._core.errors import TooManyRejectsError
    from stoker.pack import run_pack

    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        report = run_pack(options)
    except TooManyRejectsError as e:
        print(f"stoker {what}: error: {e}", file=sys.stderr)
        return 1
    except SystemExit:
        print(f"stoker {what}: terminated; partial output kept, rerun to resume", file=sys.stderr)
        raise
    except KeyboardInterrupt:
        print(f"stoker {what}: interrupted; partial output kept, rerun to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    elif not args.quiet:
        print(report.summary())
    return 0


def run(args: argparse.Namespace) -> int:
    from stoker.pack.images import DEFAULT_MAX_PIXELS

    options = make_options(
        "pack",
        src=args.src,
        out=args.out,
        workers=args.workers,
        resize=args.resize,
        quality=args.quality,
        shuffle=args.shuffle,
        seed=args.seed,
        shard_size=args.shard_size,
        list_file=args.list,
        overwrite=args.overwrite,
        resume=not args.no_resume,
        max_rejects=args.max_rejects,
        max_pixels=DEFAULT_MAX_PIXELS if args.max_pixels is None else args.max_pixels,
        follow_symlinks=args.follow_symlinks,
        root=args.root,
        allow_outside_root=args.allow_outside_root,
        progress=False if args.quiet or args.json else None,
        schema=args.schema,
        format=args.format,
        labels=args.labels,
    )
    if options is None:
        return 2
    return run_options(options, args, "pack")
