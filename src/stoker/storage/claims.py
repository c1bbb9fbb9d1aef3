"""Claims on a shard cache's budget: every reader that pins shards first claims the bytes it
may hold pinned at once (see the NOTE of :mod:`stoker.storage.cache`, Claims). A claim is a
JSON file ``ROOT/claims/PID.RAND.json`` that its process holds ``LOCK_EX`` for as long as the
claim lives; a file nobody locks is a dead process's, removed by the next reader. The
functions here run under the cache's accounting lock (:meth:`ShardCache.claim`)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from typing import Any

from stoker._core.errors import CacheFullError, size_text
from stoker._core.held import live_bodies
from stoker._core.oscompat import lock
from stoker.storage._locks import Held, close_lock, open_lock

__all__ = ["Claim", "claim", "live_claims", "run_group"]


class Claim(Held):
    """A live claim on the cache's budget (:meth:`ShardCache.claim`): released by
    :meth:`close`, by the end of its process, or as a context manager."""

    __slots__ = ("_path", "bytes", "what")
    _refusal = "a Claim is this process's lock on the cache's budget; it stays here"

    def __init__(self, path: str, fd: int, nbytes: int, what: str) -> None:
        super().__init__(fd)
        self._path, self.bytes, self.what = path, nbytes, what

    def _release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)

    def __repr__(self) -> str:
        return f"Claim({self.what!r}, {self.bytes} bytes, {'closed' if self.closed else 'live'})"


def run_group(what: str) -> str:
    """The claim group of this run's reads of ``what`` (a set's URL) on this node: the ranks of
    one ``torchrun`` (or any launcher that sets ``MASTER_ADDR`` and ``MASTER_PORT``, which no
    two live runs on a node share) are one run; any other process is a run of its own."""
    env = os.environ
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        run = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}:{env.get('TORCHELASTIC_RUN_ID', '')}"
    else:
        run = f"pid {os.getpid()}"
    return f"{run}\0{what}"


def claim(
    root: str,
    limit: int,
    nbytes: int,
    *,
    what: str,
    group: str | None = None,
    fixes: str = "",
    shared: bool = True,
    cap: int | None = None,
) -> Claim:
    """Claim ``nbytes`` of the cache at ``root`` (budget ``limit``) for pins: the claim, or
    :class:`CacheFullError` naming what is claimed already, the budget and ``fixes`` when the
    live claims and this one do not fit. ``group``: one run's claims on one set (see
    :func:`run_group`); in a group, the ``shared`` claims (of readers that pin the shards
    every rank reads) count once, as their largest, the others (a rank reading shards of its
    own) add up, and the group never counts more than ``cap`` (the whole set)."""
    if type(nbytes) is not int or nbytes < 0:
        raise ValueError(f"a claim is an int number of bytes >= 0, got {nbytes!r}")
    folder = os.path.join(root, "claims")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    live = live_claims(root)
    mine = {
        "v": 1,
        "bytes": nbytes,
        "group": group,
        "shared": bool(shared),
        "cap": cap,
        "what": what[:300],
        "pid": os.getpid(),
    }
    total = _claimed([*live, mine])
    if total > limit:
        others = [c for c in live if group is None or c.get("group") != group]
        shown = "; ".join(f"{c['what']} ({size_text(c['bytes'])})" for c in others[:6])
        held = f" Claimed already by other readers of this cache: {shown}." if shown else ""
        raise CacheFullError(
            (
                f"{what} needs {size_text(nbytes)} of the shard cache {root} at once, and its "
                f"budget is {size_text(limit)} ({size_text(total)} claimed with this one)."
                f"{held} {fixes}"
            ).rstrip()
        )
    path = os.path.join(folder, f"{os.getpid()}.{secrets.token_hex(6)}.json")
    fd = open_lock(path)
    try:
        lock(fd, block=False)
        os.write(fd, json.dumps(mine).encode())
    except BaseException:
        close_lock(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    return Claim(path, fd, nbytes, what)


def live_claims(root: str) -> list[dict[str, Any]]:
    """The claims whose process lives: ``bytes``, ``group``, ``what`` and ``pid`` of each; a
    dead process's file (nobody holds its lock) is removed."""
    return [c for c in map(_claim_of, live_bodies(os.path.join(root, "claims"))) if c]


def _claim_of(body: Any) -> dict[str, Any] | None:
    ok = isinstance(body, dict) and type(body.get("bytes")) is int and body["bytes"] >= 0
    if not ok:
        return None
    body["what"] = str(body.get("what", "a reader"))
    group = body.get("group")
    body["group"] = group if isinstance(group, str) else None
    body["shared"] = body.get("shared", True) is not False
    cap = body.get("cap")
    body["cap"] = cap if type(cap) is int and cap >= 0 else None
    return body


def _claimed(claims: list[dict[str, Any]]) -> int:
    """The bytes ``claims`` pin at once (see :func:`claim`): a claim without a group counts
    whole; a group counts its largest shared claim plus its other claims, at most its cap."""
    total = 0
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in claims:
        if c["group"] is None:
            total += c["bytes"]
        else:
            groups.setdefault(c["group"], []).append(c)
    for members in groups.values():
        shared = max((c["bytes"] for c in members if c["shared"]), default=0)
        own = sum(c["bytes"] for c in members if not c["shared"])
        caps = [c["cap"] for c in members if c["cap"] is not None]
        total += min([shared + own, *caps])
    return total
