"""``stoker doctor SOURCE``: measure each stage of the input pipeline and say what bounds it."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from stoker.cli._errors import error_text, input_problem, refuse
from stoker.cli._remote import add_remote_arguments, guarded, remote_options, scrub
from stoker.cli.check_resume import add_mix_arguments, mix_options

__all__ = ["DESCRIPTION", "HELP", "add_arguments", "run"]


HELP = "why does the GPU wait? measure read, decode, augment, loader, copy and model rates"
DESCRIPTION = """Measure, on this machine, each stage of the input pipeline for SOURCE (an
image folder, a .rec or a .stoker.json): storage reads (many files vs one packed file, cold and
warm), decode per decoder, the transforms, stoker's loader at 1..N workers, the copy to the GPU
(CUDA only) and the model's consumption. Then name the stage that bounds the run, the expected
GPU busy share and the changes ranked by their gain. Files that do not decode are named (key
and path) as a finding of their own; the loader is measured with on_error='skip' so they do not
stop it. Figures from the model rather than a measurement are marked as predictions. SOURCE may
be the URL of a RecordIO set's manifest (s3://, gs://, az://, http(s)://): then one shard is
also downloaded without the cache (MB/s, time to first byte), and the report says whether the
shard cache bounds the run under --shuffle (a loader with shuffle=True over a set larger than
--cache-limit is refused at open; shuffle='shards' needs 2 x --window + --prefetch-shards
shards)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "source",
        metavar="SOURCE",
        help="image folder, .rec/.idx file, .stoker.json manifest, or a manifest's URL",
    )
    p.add_argument(
        "--transforms",
        default="none",
        metavar="PRESET|module:attr",
        help="a preset name (seed000, seed000-uint8, imagenet, kanji, none) or module:attr of a "
        "transform (default: none)",
    )
    p.add_argument(
        "--batch-size", type=int, default=64, metavar="B", help="batch size (default 64)"
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--step-time",
        type=float,
        default=None,
        metavar="MS",
        help="the model's step time per batch, in ms",
    )
    what.add_argument(
        "--model",
        default=None,
        metavar="module:attr",
        help="a torch.nn.Module (or a callable returning one) to time on random batches",
    )
    p.add_argument(
        "--workers-max",
        type=int,
        default=None,
        metavar="N",
        help="measure the loader at 1..N workers (default: usable cores)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        metavar="S",
        help="the run's wall-clock budget after start-up, a hard cap (default 60): each "
        "measurement runs its share, then until its interval is tight while the share lasts; "
        "the report says which ended it and what it cut",
    )
    p.add_argument(
        "--sample-size",
        type=int,
        default=256,
        metavar="N",
        help="samples read and decoded (default 256; at most 40 per second of --seconds)",
    )
    p.add_argument(
        "--cache",
        choices=("auto", "warm", "cold"),
        default="auto",
        help="which storage figure to plan with (auto: warm when the data fits in memory)",
    )
    p.add_argument("--no-loader", action="store_true", help="skip the loader runs (predict only)")
    p.add_argument(
        "--check-resume",
        action="store_true",
        help="also run a short check-resume of this loader (2 workers, the first 60 steps of "
        "an epoch, 2 SIGKILLs; stoker check-resume for more) and report it; exit status 1 when "
        "the resume is not exact",
    )
    p.add_argument(
        "--json", action="store_true", help="print the report as JSON (schema stoker.doctor/2)"
    )
    p.add_argument(
        "--plot",
        default=None,
        metavar="FILE.png",
        help="also write a chart of stage rates and worker scaling (needs matplotlib: "
        'pip install "stoker[plot]")',
    )
    add_mix_arguments(p)
    _add_storage_arguments(p)


def _add_storage_arguments(p: argparse.ArgumentParser) -> None:
    """How a URL is reached and cached, and the order the shard cache is judged under."""
    add_remote_arguments(p, prefetch=True)
    p.add_argument(
        "--shuffle",
        choices=("true", "shards"),
        default="true",
        help="the training loader's order, which the shard cache is judged under (default true)",
    )
    p.add_argument(
        "--window",
        type=int,
        default=None,
        metavar="K",
        help="shuffle='shards': shards shuffled together (default 4)",
    )


def run(args: argparse.Namespace) -> int:
    return guarded("doctor", args, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from stoker.doctor import diagnose

    if os.getcwd() not in sys.path:  # so that --model/--transforms module:attr finds local files
        sys.path.insert(0, os.getcwd())
    problem = input_problem(args.source, "SOURCE", folders=True, format_option=None)
    if problem is not None:
        return refuse("doctor", problem)
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        return refuse("doctor", "--plot needs a FILE.png path")
    if args.plot is not None:  # before measuring: a long run must not end in this error
        from stoker.doctor import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as e:
            return refuse("doctor", e)
    try:
        mix_with, weights = mix_options(args)
        report = diagnose(
            args.source,
            transforms=args.transforms,
            batch_size=args.batch_size,
            step_time_ms=args.step_time,
            model=args.model,
            workers_max=args.workers_max,
            seconds=args.seconds,
            sample_size=args.sample_size,
            cache=args.cache,
            loader=not args.no_loader,
            progress=None if not args.json else False,
            remote=remote_options(args),
            shuffle="shards" if args.shuffle == "shards" else True,
            window=args.window,
            mix_with=mix_with,
            weights=weights,
        )
    except (ValueError, TypeError) as e:  # bad arguments: one line, no traceback
        from stoker._core.errors import StokerError

        if isinstance(e, StokerError):
            raise
        return refuse("doctor", scrub(error_text(e, args), args))
    if args.plot:
        report.plot(args.plot)
    resume = _check_resume(args) if args.check_resume else None
    if args.json:
        data = json.loads(report.to_json())
        if resume is not None:
            data["check_resume"] = resume.to_dict()
        print(json.dumps(data, indent=2))
    else:
        print(report.render())
        if args.plot:
            print(f"chart written to {args.plot}")
        if resume is not None:
            print(f"\nresume: {resume}")
    return 0 if resume is None or resume.passed else 1


def _check_resume(args: argparse.Namespace) -> Any:
    """A short check-resume (``stoker check-resume``) of the loader the doctor measured."""
    from stoker.cli.check_resume import loader_spec
    from stoker.resume import check_resume

    spec = loader_spec(args, workers=2)
    return check_resume(spec, kills=2, epochs=1, steps=60)
