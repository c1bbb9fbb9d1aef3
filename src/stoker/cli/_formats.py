"""What the commands that take any set (inspect, verify, unpack) share: naming its format."""

from __future__ import annotations

import argparse
import sys

__all__ = ["format_name"]


def format_name(args: argparse.Namespace, command: str) -> str | None:
    """The registry name of ``args.file``'s format (``args.format`` when given); ``None``, after
    one line on stderr, when it has none stoker reads. A bad manifest raises as every format
    error does."""
    from stoker._core.errors import StokerError
    from stoker.formats import registry

    try:
        fmt = registry.get(args.format) if args.format else registry.format_of(args.file)
    except ValueError as e:
        if isinstance(e, StokerError):
            raise
        print(f"stoker {command}: error: {e}", file=sys.stderr)
        return None
    return fmt.name
