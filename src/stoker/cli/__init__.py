"""The ``stoker`` command. Each subcommand lives in its own module with ``HELP`` (its line in
``stoker --help``), ``DESCRIPTION`` (its ``--help`` text), ``add_arguments(parser)`` and
``run(args) -> int``; nothing heavy is imported until a subcommand runs.

A mistyped option is refused by the subcommand's own parser (the closest options it has), and
a mistyped command names the closest commands. Every error is one line on stderr that names the
argument and what to do (``stoker.cli._errors``); the usage is ``--help``'s."""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["main"]

# subcommand -> module under stoker.cli, in the order `stoker --help` lists them
COMMANDS: dict[str, str] = {
    "pack": "pack",
    "convert": "convert",
    "index": "index",
    "inspect": "inspect_cmd",
    "verify": "verify",
    "unpack": "unpack",
    "sample-data": "sample_data",
    "doctor": "doctor",
    "check-resume": "check_resume",
    "cleanup": "cleanup",
}


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {' or '.join(close)}?)"


class OneLineParser(argparse.ArgumentParser):
    """A parser whose error is one line, ``PROG: error: MESSAGE; see PROG --help`` (exit
    status 2), without argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        if "--help" not in message:
            message += f"; see {self.prog} --help"
        self.exit(2, f"{self.prog}: error: {message}\n")


class SubcommandParser(OneLineParser):
    """A subcommand's parser. argparse hands a subcommand's unknown options up to the top-level
    parser, which would name the top-level command; here they are refused where they were
    given: the unknown option and the closest ones this subcommand has."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        strings = list(sys.argv[1:] if args is None else args)
        unknown = self._unknown_options(strings)
        if unknown:
            known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
            hint = _did_you_mean(unknown[0], known)
            many = "s" if len(unknown) > 1 else ""
            self.error(f"unknown option{many} {' '.join(unknown)}{hint}")
        ns, extras = super().parse_known_args(strings, namespace)
        if extras:
            self.error(f"unexpected arguments: {' '.join(extras)}")
        return ns, extras

    def _unknown_options(self, strings: list[str]) -> list[str]:
        """The option-like strings that name none of this parser's options (argparse's own
        rules: ``--opt=value``, unique prefixes of long options, negative numbers as values)."""
        known = {s for a in self._actions for s in a.option_strings}
        out = []
        for s in strings:
            if s == "--":
                break
            if not s.startswith("-") or s == "-":
                continue
            if self._negative_number_matcher.match(s) and not self._has_negative_number_optionals:
                continue
            flag = s.split("=", 1)[0]
            if flag in known:
                continue
            if flag.startswith("--") and self.allow_abbrev:
                if any(k.startswith(flag) for k in known if k.startswith("--")):
                    continue  # a prefix: argparse takes it, or names the ambiguity itself
            elif not flag.startswith("--") and flag[:2] in known:
                continue  # -x with its value attached
            out.append(flag)
        return out


def build_parser() -> argparse.ArgumentParser:
    from stoker import __version__

    parser = OneLineParser(
        prog="stoker", description="Keep the GPU fed: pack, inspect and load image datasets."
    )
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SubcommandParser)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"stoker.cli.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(p)
        p.add_argument(
            "--verbose", action="store_true", help="on an error, print its traceback too"
        )
        p.set_defaults(func=module.run, command_parser=p)
    return parser


def _refuse_unknown_command(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """A first word that is no command is refused naming the closest commands (argparse would
    only list them all)."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] in COMMANDS or argv.index(words[0]) != 0:
        return
    name = words[0]
    hint = _did_you_mean(name, list(COMMANDS))
    parser.error(f"unknown command {name!r}{hint}; commands: {', '.join(COMMANDS)}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    _refuse_unknown_command(parser, argv)
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
        from stoker.cli._errors import error_text
        from stoker.cli._remote import print_error

        if isinstance(e, (StokerError, OSError)):
            print_error(args.command, e, args, error_text(e, args))
            return 1
        raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
