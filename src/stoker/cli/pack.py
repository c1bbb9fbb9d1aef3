"""``stoker pack SRC OUT``: an image folder, im2rec list or ``.jsonl``/``.csv`` listing →
shards of a format (RecordIO by default, TFRecord, WebDataset) + manifest."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from stoker.cli._errors import pack_source_problem, refuse
from stoker.cli._remote import add_remote_arguments
from stoker.formats.registry import DEFAULT as DEFAULT_FORMAT

__all__ = [
    "DESCRIPTION",
    "HELP",
    "add_arguments",
    "add_scale_options",
    "run",
    "run_options",
    "run_plan_steps",
    "step_usage",
    "writable_formats",
]


HELP = (
    "pack an image folder, an im2rec .lst or a .jsonl/.csv listing into RecordIO "
    "(or TFRecord, WebDataset) shards"
)
DESCRIPTION = """Pack SRC (an image folder with one class per top-level subfolder, an im2rec
.lst file, or a .jsonl/.csv listing of images with fields: label, boxes, text, masks...; see
docs/pack.md) into OUT.rec/OUT.idx (OUT-NNNNN.* with --shard-size), OUT.crc32c, OUT.stoker.json
and OUT.rejects.tsv (--format tfrecord: OUT.tfrecord; --format wds: OUT.tar, WebDataset).
Original JPEG bytes are kept unless --resize or --quality asks for a re-encode. OUT's folder is
created when missing. An interrupted run resumes."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "src", nargs="?", help="image folder, an im2rec .lst file, or a .jsonl/.csv listing"
    )
    p.add_argument(
        "out", nargs="?", help="output prefix, e.g. data/train (writes data/train.rec, ...)"
    )
    p.add_argument(
        "--format",
        default=DEFAULT_FORMAT,
        choices=writable_formats(),
        help=f"what to write (default: {DEFAULT_FORMAT})",
    )
    p.add_argument(
        "--labels",
        default="folders",
        choices=("folders", "none"),
        help="a folder's labels: one class per top-level subfolder (default; a folder of "
        "images without subfolders is refused), or none (every record 0, no class names)",
    )
    p.add_argument(
        "--layout",
        default="plain",
        choices=("plain", "insightface"),
        help="plain: one record per image (default); insightface: one OUT.rec whose images "
        "are keys 1..N (one identity per class folder), then insightface's header record 0 "
        "and one record per identity with its key range, as insightface's training code "
        "reads them (docs/pack.md)",
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
        "--root",
        default=None,
        help="folder that .lst and listing paths are relative to; given, entries must lie in it",
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
        help="with --root, pack entries that lead outside it (default: rejected outside_root)",
    )
    add_scale_options(p)
    add_remote_arguments(p)  # --storage-option for an OUT in object storage
    p.add_argument("--quiet", action="store_true", help="no progress bar, no summary")
    p.add_argument(
        "--json", action="store_true", help="print the report as JSON on stdout (no bar)"
    )


def _storage(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--storage-option``: how SRC's, OUT's and the plan's URLs are reached."""
    pairs = getattr(args, "storage_options", None)
    return dict(pairs) if pairs else None


def add_scale_options(p: argparse.ArgumentParser, what: str = "pack") -> None:
    """The engine, and packing (or converting) as shard jobs (docs/scale.md)."""
    p.add_argument(
        "--engine",
        default="local",
        choices=("local", "ray"),
        help="what runs the shards: this machine's process pool (default) or one Ray task "
        "per shard (pip install stoker[ray])",
    )
    p.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="with --engine ray: the Ray cluster (default: RAY_ADDRESS, else a Ray started here)",
    )
    p.add_argument(
        "--plan-only",
        action="store_true",
        help="list SRC and write the plan (OUT.plan.json; for a URL OUT, NAME.plan.json here; "
        "or --plan PATH); " + what + " nothing (then --plan ... --shards)",
    )
    p.add_argument(
        "--plan",
        default=None,
        metavar="PLAN",
        help="a plan file from --plan-only: with --shards A:B or --finalize (no SRC, OUT); "
        "with --plan-only, where to write it",
    )
    p.add_argument(
        "--shards",
        default=None,
        metavar="A:B",
        help="with --plan: " + what + " shards A..B-1 (Python slice rules; N for one); done "
        "ones are verified and skipped",
    )
    p.add_argument(
        "--finalize",
        action="store_true",
        help="with --plan: check every shard and write the rejects list and the manifest",
    )


#: Options a plan file holds: refused beside --plan (dest, flag, default).
_PLAN_HELD = (
    ("format", "--format", DEFAULT_FORMAT),
    ("labels", "--labels", "folders"),
    ("layout", "--layout", "plain"),
    ("resize", "--resize", None),
    ("quality", "--quality", None),
    ("shuffle", "--shuffle", False),
    ("seed", "--seed", 0),
    ("shard_size", "--shard-size", None),
    ("list", "--list", False),
    ("overwrite", "--overwrite", False),
    ("no_resume", "--no-resume", False),
    ("max_rejects", "--max-rejects", None),
    ("max_pixels", "--max-pixels", None),
    ("follow_symlinks", "--follow-symlinks", False),
    ("root", "--root", None),
    ("schema", "--schema", None),
    ("allow_outside_root", "--allow-outside-root", False),
    ("engine", "--engine", "local"),
)


def step_usage(args: argparse.Namespace, held: tuple = _PLAN_HELD) -> str | None:
    """What is wrong with the combination of step options (``None``: nothing); ``held``:
    the (dest, flag, default) of the options a plan holds."""
    if args.address is not None and args.engine != "ray":
        return "--address is for --engine ray"
    if args.plan_only:
        if args.shards is not None or args.finalize:
            return "--plan-only makes a plan; --shards and --finalize use one (--plan PLAN)"
        if args.src is None or args.out is None:
            return "--plan-only takes SRC and OUT (and --plan PATH: where the plan goes)"
        if args.engine != "local":
            return "--plan-only writes a plan; the shard jobs then run anywhere (--engine: no)"
        return None
    if args.plan is None:
        if args.shards is not None or args.finalize:
            return "--shards and --finalize take a plan: --plan PLAN (made with --plan-only)"
        if args.src is None or args.out is None:
            return "give SRC and OUT (or --plan PLAN with --shards A:B or --finalize)"
        return None
    if args.src is not None:
        return "--plan takes no SRC or OUT: the plan holds them"
    if (args.shards is None) == (not args.finalize):
        return "--plan needs one of --shards A:B or --finalize"
    changed = [flag for dest, flag, default in held if getattr(args, dest, default) != default]
    if changed:
        return f"{', '.join(changed)}: the plan holds the options; make a new plan to change them"
    return None


def _report(args: argparse.Namespace, report: Any) -> None:
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    elif not args.quiet:
        print(report.summary())


def writable_formats() -> list[str]:
    """The registry's formats that have a writer (the registry imports nothing heavy)."""
    from stoker.formats.registry import FORMATS

    return [name for name, fmt in FORMATS.items() if fmt.writer is not None]


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_options(args: argparse.Namespace, what: str, **options: Any) -> int:
    """Run a pack or convert of ``PackOptions(**options)`` with SIGTERM as a clean stop and
    print the summary (or JSON); with ``--plan-only``, write its plan and say what comes next.
    A value no flag's type caught (such as ``--seed -1``) is one line on stderr naming the
    option (exit 2)."""
    from stoker.cli._errors import error_text
    from stoker.pack import PackOptions, run_pack

    try:
        opts = PackOptions(**options)
    except (TypeError, ValueError) as e:
        return refuse(what, error_text(e, args))
    storage = _storage(args)
    if args.plan_only:
        from stoker.pack.steps import write_plan

        def step() -> _PlanMade:
            return _PlanMade(write_plan(opts, args.plan, storage_options=storage), what)

        return _run_step(step, args, what)
    return _run_step(lambda: run_pack(opts, storage_options=storage), args, what)


def _run_step(step: Any, args: argparse.Namespace, what: str) -> int:
    """Run ``step()`` with SIGTERM as a clean stop; print its report's summary (or JSON)."""
    from stoker._core.errors import TooManyRejectsError

    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        report = step()
    except TooManyRejectsError as e:
        from stoker.cli._errors import error_text

        return refuse(what, error_text(e, args), 1)
    except SystemExit:
        print(f"stoker {what}: terminated; partial output kept, rerun to resume", file=sys.stderr)
        raise
    except KeyboardInterrupt:
        print(f"stoker {what}: interrupted; partial output kept, rerun to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old)
    _report(args, report)
    return 0


class _PlanMade:
    """What ``--plan-only`` prints."""

    def __init__(self, path: str, what: str) -> None:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        self.path, self.records, self.shards = path, doc["records"], len(doc["shards"])
        self.what = what

    def to_json(self) -> dict[str, Any]:
        return {"plan": self.path, "records": self.records, "shards": self.shards}

    def summary(self) -> str:
        cmd = f"stoker {self.what} --plan {self.path}"
        return (
            f"plan: {self.path} ({self.records} records in {self.shards} shard(s)); next: "
            f"{cmd} --shards 0:{self.shards} (any split, anywhere that sees SRC and OUT), "
            f"then {cmd} --finalize"
        )


def run_plan_steps(args: argparse.Namespace, what: str) -> int:
    """``--plan PLAN --shards A:B`` or ``--plan PLAN --finalize``."""
    from stoker.pack.steps import finalize_pack, pack_shards

    progress = False if args.quiet or args.json else None
    so = _storage(args)
    if args.finalize:
        return _run_step(
            lambda: finalize_pack(args.plan, progress=progress, storage_options=so), args, what
        )
    try:
        from stoker.pack import PackOptions

        PackOptions(".", "x", workers=args.workers)  # checks --workers as a pack does
    except (TypeError, ValueError) as e:
        return refuse(what, e)

    def step() -> Any:
        try:
            return pack_shards(
                args.plan, args.shards, workers=args.workers, progress=progress, storage_options=so
            )
        except ValueError as e:  # a --shards value
            from stoker._core.errors import PackError

            raise PackError(str(e)) from None

    return _run_step(step, args, what)


def run(args: argparse.Namespace) -> int:
    from stoker.pack.images import DEFAULT_MAX_PIXELS

    bad = step_usage(args)
    if getattr(args, "cache_dir", None) or getattr(args, "cache_limit", None):
        bad = "--cache-dir and --cache-limit are for reading a set; a pack stages its output "
        bad += "under the stoker cache dir ($STOKER_CACHE_DIR)"
    if not bad and args.plan is None:
        problem = pack_source_problem(args.src)
        if problem is not None:  # the exit status of a source the packer refuses
            return refuse("pack", problem, 1)
    if bad:
        return refuse("pack", bad)
    if args.plan is not None and not args.plan_only:
        return run_plan_steps(args, "pack")
    return run_options(
        args,
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
        engine=args.engine,
        ray_address=args.address,
        layout=args.layout,
    )
