"""An LMDB database checked before this process maps it, so that damaged pages give an error
naming the file instead of killing the process.

liblmdb trusts the file. A file shorter than its meta pages say faults the reader with SIGBUS;
a zeroed or scribbled branch or leaf page trips liblmdb's assertions (``IS_LEAF``,
``IS_BRANCH``: SIGABRT). Neither can be caught in the process that reads. So, before the first
``lmdb.open`` of a database in a process:

1. the meta pages are read with plain file reads and checked against the file
   (:mod:`.pages`: the page size, the second meta page, every committed page present);
2. a child process (``_walk.py``) does every liblmdb call a reader will make, once: one cursor
   pass over keys and values, and a lookup of every key. If liblmdb crashes there, or reports
   an error in the cursor pass, or the pass finds another number of records than the
   database counts, the database is refused with a :class:`CorruptRecordError` naming the
   file and how far the walk got.

The verdict is cached in the cache directory (kind ``lmdb-check``, keyed like the key list: the
data file's path, device, inode, size and modification time), together with the meta page's
transaction id, last page and root, which must still match. It is also kept for the life of the
process. So a database is walked once, not per worker or per open.

Cache entry: JSON ``{"version": 1, "txnid", "last_pg", "root", "entries", "verdict"}``, where
``verdict`` is ``null`` (sound) or ``{"kind": "corrupt" | "unreadable", "reason": str}``. A
walk that does not finish within its time limit is refused and not cached.

NOTE [ The walk's child process ]: ``subprocess.run`` with stdin closed and stdout/stderr
piped; the parent waits for it (the lock that guards this process's environments is held
meanwhile, so one database is walked once even when threads open it together). Timeout:
``walk_timeout`` (60 s plus 1 s per 20 MB), then the child is killed and the open refused. On
Ctrl-C in the parent, ``subprocess.run`` kills and reaps the child before the
KeyboardInterrupt goes on. If the parent is killed, the child only reads: it finishes its walk,
or stops at its next line of output (a broken pipe). It never writes anything but that
output.

The price: an open whose verdict is not cached reads every page of the database once; see the
folder's README for measured figures. Not caught: a file changed in place after its verdict was
cached while keeping its size and modification time, and a file truncated while it is mapped
(a SIGBUS, as for any memory-mapped file).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from typing import Any

from stoker._core.atomic import write_cache_file
from stoker._core.cache import cache_file, file_identity
from stoker._core.errors import CorruptRecordError
from stoker.formats.lmdb.location import (
    OPEN_OPTIONS,
    LmdbFormatError,
    Location,
    import_lmdb,
    show_key,
)
from stoker.formats.lmdb.pages import Meta, read_meta

__all__ = ["check_database", "walk_timeout"]

_KIND = "lmdb-check"
_SUFFIX = ".json"
_VERSION = 1
_MAX_ENTRY = 1 << 16  # bytes: a verdict is a few hundred
_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_walk.py")

Verdict = dict[str, str] | None  # None: sound; else {"kind", "reason"}
#: the signals by which liblmdb dies on damaged pages: its assertions abort, bad pointers fault
_FAULTS = frozenset(
    int(s) for s in (signal.SIGABRT, signal.SIGBUS, signal.SIGSEGV, signal.SIGFPE, signal.SIGILL)
)

# verdicts this process has reached: (data file, identity, txnid, last page, root) -> verdict
_SEEN: dict[tuple, Verdict] = {}


def walk_timeout(size: int) -> float:
    """Seconds the walk of a ``size``-byte file may take: a minute, plus a second per 20 MB."""
    return 60.0 + size / 20e6


def check_database(loc: Location) -> Meta:
    """Check ``loc``'s data file (see the module docstring); returns its meta page. Raises
    :class:`CorruptRecordError` (damaged pages) or :class:`LmdbFormatError` (not an LMDB
    database) naming the file."""
    data = loc.data_file
    meta = read_meta(data, loc.path)
    ident = (os.path.abspath(data), *file_identity(data), meta.txnid, meta.last_pg, meta.root)
    if ident in _SEEN:
        verdict = _SEEN[ident]
    else:
        entry = None
        with contextlib.suppress(OSError):
            entry = cache_file(_KIND, data, _SUFFIX)
        found, verdict = _read_entry(entry, meta)
        if not found:
            verdict = _walk(loc)
            if entry is not None:
                write_cache_file(entry, [_entry_bytes(meta, verdict)])
        _SEEN[ident] = verdict
    if verdict is None:
        return meta
    if verdict["kind"] == "unreadable":
        raise LmdbFormatError(loc.path, verdict["reason"])
    raise CorruptRecordError(data, None, verdict["reason"])


def _facts(meta: Meta) -> dict[str, int]:
    return {
        "txnid": meta.txnid,
        "last_pg": meta.last_pg,
        "root": meta.root,
        "entries": meta.entries,
    }


def _entry_bytes(meta: Meta, verdict: Verdict) -> bytes:
    return json.dumps({"version": _VERSION, **_facts(meta), "verdict": verdict}).encode()


def _read_entry(path: str | None, meta: Meta) -> tuple[bool, Verdict]:
    """(found, verdict) from a cache entry that is well formed and matches ``meta``."""
    if path is None:
        return False, None
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_ENTRY + 1)
        d = json.loads(raw) if len(raw) <= _MAX_ENTRY else None
    except (OSError, ValueError):
        return False, None
    if not isinstance(d, dict) or d.get("version") != _VERSION:
        return False, None
    if any(d.get(k) != v for k, v in _facts(meta).items()):
        return False, None
    v = d.get("verdict")
    if v is None:
        return True, None
    if (
        isinstance(v, dict)
        and v.get("kind") in ("corrupt", "unreadable")
        and isinstance(v.get("reason"), str)
    ):
        return True, {"kind": v["kind"], "reason": v["reason"]}
    return False, None


def _walk(loc: Location) -> Verdict:
    """Run ``_walk.py`` on ``loc`` in a child process and read its verdict."""
    data = loc.data_file
    lmdb = import_lmdb()  # the child falls back on the folder this process imported it from
    where = os.path.dirname(os.path.dirname(os.path.abspath(lmdb.__file__)))
    limit = walk_timeout(os.path.getsize(data))
    if not sys.executable:
        raise OSError(f"{data}: no Python executable to check its LMDB pages with")
    options = json.dumps(OPEN_OPTIONS)
    cmd = [sys.executable, _SCRIPT, loc.path, "1" if loc.subdir else "0", where, options]
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=limit)
    except subprocess.TimeoutExpired:
        raise CorruptRecordError(
            data,
            None,
            f"walking the LMDB B-tree did not finish within {limit:.0f} s "
            "(a loop in damaged pages, or a very slow disk); the database is not opened",
        ) from None
    except OSError as e:
        raise OSError(f"{data}: cannot start the process that checks its LMDB pages: {e}") from e
    lines = _lines(r.stdout)
    last = lines[-1] if lines else {}
    if -r.returncode in _FAULTS:
        return {"kind": "corrupt", "reason": _crash(r.returncode, lines, r.stderr)}
    if r.returncode < 0:  # killed from outside (the OOM killer, a signal to the group): no verdict
        raise OSError(
            f"{data}: the process that checks its LMDB pages was killed "
            f"({_signame(-r.returncode)}); nothing is cached, the next open checks again"
        )
    if "done" in last and last["done"] == last.get("entries"):
        return None
    if "done" in last:  # node pointers that point at garbage, or a count that is wrong
        return {
            "kind": "corrupt",
            "reason": f"damaged LMDB pages: the B-tree walk found {last['done']} records, "
            f"the database counts {last.get('entries')}",
        }
    if "error" in last and last.get("open"):
        return {"kind": "unreadable", "reason": f"not a readable LMDB database: {last['error']}"}
    if "error" in last:
        n, key = int(last.get("at", 0)), bytes.fromhex(str(last.get("key", "")))
        after = f", after LMDB key {show_key(key)}" if n else ""
        return {
            "kind": "corrupt",
            "reason": f"damaged LMDB pages: {last['error']} (the B-tree walk stopped after "
            f"{n} records in key order{after})",
        }
    tail = r.stderr.decode(errors="replace").strip().splitlines()[-1:]
    raise OSError(
        f"{data}: the process that checks its LMDB pages exited with {r.returncode}"
        + (f": {tail[0]}" if tail else "")
    )


def _lines(out: bytes) -> list[dict[str, Any]]:
    got = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            d = json.loads(line)
            if isinstance(d, dict):
                got.append(d)
    return got


def _signame(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _crash(returncode: int, lines: list[dict[str, Any]], stderr: bytes) -> str:
    sig = _signame(-returncode)
    at = max((int(d.get("at", 0)) for d in lines), default=0)  # reported every 256 records
    said = stderr.decode(errors="replace").strip().splitlines()[-1:]
    # liblmdb's assertion text, without the build folder: "mdb.c:6273: Assertion ..."
    why = f"{sig}: {re.sub(r'^[^ ]*/', '', said[0])[:200]}" if said else sig
    return (
        f"damaged LMDB pages: liblmdb crashed ({why}) walking the B-tree, "
        f"between records {at} and {at + 256} in key order; "
        "reading this file would kill the reading process, so it is not opened"
    )
