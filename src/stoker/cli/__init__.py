"""The ``stoker`` command. Each subcommand lives in its own module with ``add_parser(sub)``
and ``run(args) -> int``; nothing heavy is imported until a subcommand runs."""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main"]

# subcommand -> module under stoker.cli, in the order `stoker --help` lists them
COMMANDS: dict[str, str] = {
    "pack": "pack",
    "convert": "convert",
    "inspect": "inspect_cmd",
    "verify": "verify",
    "unpack": "unpack",
    "sample-data": "sample_data",
    "doctor": "doctor",
    "cleanup": "cleanup",
}


def build_parser() -> argparse.ArgumentParser:
    from stoker import __version__

    parser = argparse.ArgumentParser(
        prog="stoker", description="Keep the GPU fed: pack, inspect and load image datasets."
    )
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"stoker.cli.{module_name}")
        module.add_parser(sub, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("stoker: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - top-level: one clear line, no traceback
        from stoker._core.errors import StokerError

        if isinstance(e, (StokerError, OSError)):
            print(f"stoker {args.command}: error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
