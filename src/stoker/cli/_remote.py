"""What the commands that read a set by URL share (inspect, verify, unpack, convert, doctor).

``--storage-option KEY=VALUE`` (repeatable: fsspec options such as ``endpoint_url`` or
``anon=true``; a value that reads as JSON is taken as JSON), ``--cache-dir`` and
``--cache-limit`` (bytes, or with a unit: ``500M``, ``2G``) become one
:class:`~stoker.formats.remote.RemoteOptions`; without them credentials and endpoints come from
the standard places (``AWS_*`` variables including ``AWS_ENDPOINT_URL``, ``~/.aws``) and the
cache from its defaults. They are ignored for a local path.

:func:`guarded` runs a command so that an error is one line on stderr with credentials taken
out (:func:`stoker.storage.urls.redact`, and the values given with ``--storage-option``);
``--verbose`` puts its traceback before it (:func:`print_error`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from typing import Any

__all__ = [
    "add_remote_arguments",
    "guarded",
    "parse_size",
    "print_error",
    "remote_options",
    "scrub",
]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """Bytes from ``text``: a whole number, or a number with a unit (``K``, ``M``, ``G``,
    ``T`` and ``KiB`` ... ``TiB``: powers of 1024; ``KB`` ... ``TB``: powers of 1000)."""
    m = _SIZE.fullmatch(str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes such as 500M, 2G or 1073741824, got {text!r}"
        )
    n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise argparse.ArgumentTypeError(f"a size must be more than 0 bytes, got {text!r}")
    return n


def _storage_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` as ``(key, value)``; the value as JSON when it reads as JSON (``true``,
    ``3``, ``{"region_name": "x"}``), else as the string given. An error never repeats the
    value (it may be a secret)."""
    key, sep, value = str(text).partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError("expected KEY=VALUE (an fsspec option)")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value


def add_remote_arguments(p: argparse.ArgumentParser, *, prefetch: bool = False) -> None:
    """The options that say how a URL is reached and cached (see the module docstring)."""
    g = p.add_argument_group(
        "a set in object storage (s3://, gs://, az://, http(s)://: its NAME.stoker.json)"
    )
    g.add_argument(
        "--storage-option",
        dest="storage_options",
        action="append",
        type=_storage_option,
        default=None,
        metavar="KEY=VALUE",
        help="an fsspec option for the storage (repeatable), e.g. endpoint_url=http://host:9000 "
        "or anon=true; default: credentials and endpoint from the AWS_* variables and ~/.aws",
    )
    g.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help="the shard cache's folder (default: <stoker cache dir>/shards)",
    )
    g.add_argument(
        "--cache-limit",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="the shard cache's byte budget, e.g. 20G (default: the smaller of 100 GiB and half "
        "the free space where it lives)",
    )
    g.add_argument(
        "--allow-host",
        dest="allow_hosts",
        action="append",
        default=None,
        metavar="HOST",
        help="a host (or bucket) besides the manifest's whose files it may name by URL, such "
        "as tars `stoker index` indexed in place (repeatable)",
    )
    if prefetch:
        g.add_argument(
            "--prefetch-shards",
            type=int,
            default=None,
            metavar="N",
            help="shards a loader downloads ahead of its reading order (default 2)",
        )


def remote_options(args: argparse.Namespace) -> Any:
    """The :class:`~stoker.formats.remote.RemoteOptions` the arguments give; ``None`` when none
    was given (the library's defaults apply)."""
    from stoker.formats.remote import RemoteOptions

    pairs = getattr(args, "storage_options", None)
    kw: dict[str, Any] = {
        "storage_options": dict(pairs) if pairs else None,
        "cache_dir": getattr(args, "cache_dir", None),
        "cache_limit": getattr(args, "cache_limit", None),
    }
    for name in ("prefetch_shards", "allow_hosts"):
        if getattr(args, name, None) is not None:
            kw[name] = getattr(args, name)
    if all(v is None for v in kw.values()):
        return None
    return RemoteOptions(**kw)


def scrub(text: object, args: argparse.Namespace | None = None) -> str:
    """``text`` without credentials: :func:`~stoker.storage.urls.redact`, and every value
    given with ``--storage-option`` (longer than 3 characters) replaced by ``***``."""
    from stoker.storage.urls import redact

    out = redact(str(text))
    for _, value in getattr(args, "storage_options", None) or ():
        for v in _strings(value):
            if len(v) > 3 and v in out:
                out = out.replace(v, "***")
    return out


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def guarded(command: str, args: argparse.Namespace, body: Callable[[], int]) -> int:
    """``body()``; an error about the data, the storage or an argument is one line on stderr
    without credentials: exit 1 (exit 2 for a bad argument: a plain ``ValueError`` or
    ``TypeError``). Anything else propagates."""
    from stoker._core.errors import StokerError
    from stoker.cli._errors import error_text

    try:
        return body()
    except (StokerError, OSError, ValueError, TypeError) as e:
        print_error(command, e, args, scrub(error_text(e, args), args))
        return 1 if isinstance(e, (StokerError, OSError)) else 2


def print_error(command: str, e: BaseException, args: argparse.Namespace, text: str) -> None:
    """``stoker COMMAND: error: TEXT`` on stderr; with ``--verbose``, ``e``'s traceback first
    (a child process's too: its ``__cause__``), credentials taken out."""
    if getattr(args, "verbose", False):
        import traceback

        print(scrub("".join(traceback.format_exception(e)), args), end="", file=sys.stderr)
    print(f"stoker {command}: error: {text}", file=sys.stderr)
