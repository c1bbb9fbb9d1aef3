"""What the commands that take any set (inspect, verify, unpack) share: naming its format."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from stoker.cli._remote import guarded, remote_options, scrub

__all__ = ["add_format_argument", "format_name", "run_on_set"]


def add_format_argument(p: argparse.ArgumentParser) -> None:
    """``--format NAME`` of a command that reads any set: the registry's names."""
    from stoker.formats import registry

    p.add_argument(
        "--format",
        default=None,
        choices=registry.names(),
        help="the format, when FILE does not tell it",
    )


def format_name(args: argparse.Namespace, command: str) -> str | None:
    """The registry name of ``args.file``'s format (``args.format`` when given); ``None``, after
    one line on stderr, when it has none stoker reads or is no set (a missing path, an image
    folder or a listing not yet packed: :func:`~stoker.cli._errors.input_problem`). A URL's
    manifest is read as the remote options say (``--storage-option``, ``--cache-dir``,
    ``--cache-limit``). A bad manifest raises as every format error does."""
    from stoker._core.errors import StokerError
    from stoker.cli._errors import argument_label, input_problem
    from stoker.formats import registry
    from stoker.formats.remote import remote_url

    if args.format and remote_url(args.file) is not None:
        try:
            known = registry.get(args.format)
        except ValueError as e:
            print(f"stoker {command}: error: {e}", file=sys.stderr)
            return None
        if not known.remote:
            print(
                f"stoker {command}: error: {scrub(args.file, args)}: --format {args.format}: "
                f"a {args.format} set is read from local files only; `stoker convert` it to "
                "RecordIO, TFRecord or WebDataset (read in place from a URL) or copy it to "
                "local disk",
                file=sys.stderr,
            )
            return None
    problem = input_problem(args.file, argument_label(args, "file"), detect=not args.format)
    if problem is not None:
        print(f"stoker {command}: error: {problem}", file=sys.stderr)
        return None
    try:
        if args.format:
            fmt = registry.get(args.format)
        else:
            fmt = registry.format_of(args.file, remote=remote_options(args))
    except ValueError as e:
        if isinstance(e, StokerError):
            raise
        print(f"stoker {command}: error: {scrub(e, args)}", file=sys.stderr)
        return None
    return fmt.name


def run_on_set(command: str, args: argparse.Namespace, body: Callable[[str], int]) -> int:
    """``body(name)`` with the registry name of ``args.file``'s format, :func:`guarded`; exit
    2 when it has none (:func:`format_name` said why on stderr)."""

    def run() -> int:
        name = format_name(args, command)
        return 2 if name is None else body(name)

    return guarded(command, args, run)
