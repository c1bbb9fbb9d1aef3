"""``stoker check-resume SOURCE``: kill a loader run at random steps, resume it from its last
saved state and check that it delivers exactly the samples of an uninterrupted run."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from stoker.cli._remote import add_remote_arguments, guarded, remote_options

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "loader_spec", "run"]


HELP = "prove that a loader resumes exactly: SIGKILL it at random steps and compare"
DESCRIPTION = """Run the loader configuration given by SOURCE and the options (or by --factory)
in child processes: first without interruption, then saving state_dict() every few steps as a
checkpointing loop does, SIGKILLed at --kills random steps and resumed each time from the last
saved state, on --world-size ranks or, from the first kill on, on --resume-on ranks. The
samples delivered across the kills must be the uninterrupted run's, each with byte-identical
pixels, label and fields; the verdict names the first sample that differs and why. Exit status
0: exact; 1: not exact, or a run could not finish (the message says which); 2: a bad argument."""


def add_mix_arguments(g: Any) -> None:
    """``--mix-with SET`` (repeated) and ``--weights W,W,...``: a mixture of SOURCE and SETs."""
    g.add_argument(
        "--mix-with",
        action="append",
        default=[],
        metavar="SET",
        help="another set mixed with SOURCE (repeat for more; needs --weights)",
    )
    g.add_argument(
        "--weights", default=None, metavar="W,W,...", help="the sets' weights, SOURCE's first"
    )


def mix_options(args: argparse.Namespace) -> tuple[list[str], list[float] | None]:
    """The sets after SOURCE and their ``weights=`` (``([], None)`` for one set)."""
    others, weights = getattr(args, "mix_with", None), getattr(args, "weights", None)
    if bool(others) != bool(weights):
        raise ValueError("a mixture needs both --mix-with SET and --weights W,W,...")
    return list(others or []), [float(w) for w in weights.split(",")] if weights else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        metavar="SOURCE",
        nargs="?",
        default=None,
        help="a set in any format (.stoker.json manifest, .rec, .tfrecord, .tar, LMDB folder, "
        "image folder) or a manifest's URL",
    )
    p.add_argument(
        "--factory",
        default=None,
        metavar="module:attr",
        help="instead of SOURCE and the loader options: a function make_loader(rank=, "
        "world_size=) returning your loader (importable from the current folder)",
    )
    g = p.add_argument_group("the loader (with SOURCE)")
    g.add_argument("--batch-size", type=int, default=64, metavar="B", help="default 64")
    g.add_argument(
        "--transforms",
        default="none",
        metavar="PRESET|module:attr",
        help="a preset name (seed000, seed000-uint8, imagenet, kanji, none) or module:attr of "
        "a transform (default: none)",
    )
    g.add_argument(
        "--shuffle",
        choices=("false", "true", "shards"),
        default="true",
        help="the order: as stored, one permutation per epoch, or shard order (default true)",
    )
    g.add_argument("--seed", type=int, default=0, help="the loader's seed (default 0)")
    g.add_argument("--workers", type=int, default=None, metavar="N", help="worker processes")
    g.add_argument("--drop-last", action="store_true", help="drop_last=True")
    add_mix_arguments(g)
    c = p.add_argument_group("the check")
    c.add_argument("--kills", type=int, default=3, metavar="K", help="SIGKILLs (default 3)")
    c.add_argument("--world-size", type=int, default=1, metavar="N", help="ranks (default 1)")
    c.add_argument(
        "--resume-on",
        type=int,
        default=None,
        metavar="M",
        help="ranks every restart resumes on (default: --world-size)",
    )
    c.add_argument("--epochs", type=int, default=2, metavar="E", help="epochs run (default 2)")
    c.add_argument(
        "--save-every",
        type=int,
        default=None,
        metavar="S",
        help="steps between saved states (default: a quarter of the steps between kills)",
    )
    c.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="S",
        help="stop every run at step S: a bounded check of a large set's first S steps "
        "(default: run the --epochs whole)",
    )
    c.add_argument(
        "--kill-seed", type=int, default=0, metavar="S", help="draws the kill steps (default 0)"
    )
    c.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SEC",
        help="seconds a run may go without a step before it counts as stalled (default 300)",
    )
    c.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    add_remote_arguments(p, prefetch=True)


def run(args: argparse.Namespace) -> int:
    return guarded("check-resume", args, lambda: _run(args))


def _factory(args: argparse.Namespace) -> Any:
    from stoker.resume.spec import import_attr

    if (args.source is None) == (args.factory is None):
        raise ValueError("give either SOURCE (and the loader options) or --factory module:attr")
    if os.getcwd() not in sys.path:  # so that module:attr finds local files
        sys.path.insert(0, os.getcwd())
    if args.factory is not None:
        return import_attr(args.factory, "--factory")
    return loader_spec(args)


def loader_spec(args: argparse.Namespace, *, workers: int | None = None) -> Any:
    """The :class:`~stoker.resume.LoaderSpec` of a command's loader options (``source``,
    ``batch_size``, ``transforms``, ``shuffle`` and the remote options; ``seed``, ``workers``
    and ``drop_last`` where the command has them, else ``workers``)."""
    from stoker.resume import LoaderSpec

    remote = remote_options(args)
    options: dict[str, Any] = {}
    if remote is not None:
        options = {
            "storage_options": remote.storage_options,
            "cache_dir": remote.cache_dir,
            "cache_limit": remote.cache_limit,
            "prefetch_shards": remote.prefetch_shards,
        }
    shuffle: bool | str = {"false": False, "true": True}.get(args.shuffle, args.shuffle)
    others, weights = mix_options(args)
    source: Any = (args.source, *others) if others else args.source
    options.update({"weights": weights} if others else {})
    spec = LoaderSpec(
        source,
        batch_size=args.batch_size,
        transforms=args.transforms,
        shuffle=shuffle,
        seed=getattr(args, "seed", 0),
        drop_last=getattr(args, "drop_last", False),
        workers=getattr(args, "workers", workers),
        options=options,
    )
    spec.resolved_transforms()  # a bad --transforms is refused here, not in every child
    return spec


def _run(args: argparse.Namespace) -> int:
    from stoker.resume import check_resume

    report = check_resume(
        _factory(args),
        kills=args.kills,
        world_size=args.world_size,
        resume_on=args.resume_on,
        epochs=args.epochs,
        save_every=args.save_every,
        seed=args.kill_seed,
        steps=args.steps,
        timeout=args.timeout,
        log=None if args.json else (lambda m: print(m, file=sys.stderr)),
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        print(report)
    return 0 if report.passed else 1
