"""The loader's ``state_dict``: its fields, and the one check of a state read back.

A state is small JSON: ``{version, dataset (the source's fingerprint), sampler (the sampler's
fingerprint), seed, batch_size, pair, epoch, batch (the next one), world_size, drop_last,
resumed, bad: {epoch, total}}``. ``world_size`` and ``drop_last`` are the ranks and the
loader's ``drop_last`` the position counts in; ``resumed`` lists the earlier parts of this
epoch, ``[{world_size, batch}, ...]`` oldest first, when the epoch was resumed on another
number of ranks (``stoker.sampling.elastic``), else ``[]``.

:meth:`LoaderState.from_dict` refuses anything else (wrong type: ``TypeError``; out of range,
unknown or missing fields, over 1 MiB: ``ValueError``; another version:
``IncompatibleStateError``), naming the field. A version 1 state (without ``world_size``,
``drop_last`` and ``resumed``) is read with the values its sampler fingerprint gives (else 1
rank, no ``drop_last``) and no earlier parts. Whether a state fits a given loader (same
dataset, seed, batch size, sampler) is the loader's check.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

from stoker._core.checks import check_int, check_seed
from stoker._core.errors import IncompatibleStateError

__all__ = ["STATE_VERSION", "LoaderState", "check_batch_size", "check_fraction", "check_timeout"]

STATE_VERSION = 2
_OLD_FIELDS = ("world_size", "drop_last", "resumed")  # what version 1 lacks
MAX_WORLD = 1 << 20
MAX_RESUMED = 64  # elastic resumes inside one epoch
MAX_BATCH_SIZE = 1 << 24
MAX_COUNTER = 1 << 53  # epochs and skip counters
_MAX_BATCH = 1 << 40
_MAX_VERSION = 1 << 31
_MAX_STATE_BYTES = 1 << 20


def check_batch_size(value: object) -> int:
    """A batch size: an int in ``[1, 2**24]``."""
    return check_int("batch_size", value, minimum=1, maximum=MAX_BATCH_SIZE)


def check_timeout(timeout: object) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds or None, got {timeout}")
    return timeout


def check_fraction(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"max_bad_fraction must be a number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"max_bad_fraction must be in [0, 1], got {value}")
    return float(value)


@dataclass(frozen=True)
class LoaderState:
    """A loader's position and what it must match to resume."""

    dataset: dict
    sampler: dict
    seed: int
    batch_size: int
    pair: bool
    epoch: int
    batch: int
    bad_epoch: int
    bad_total: int
    world_size: int = 1
    drop_last: bool = False
    resumed: tuple[tuple[int, int], ...] = ()  # (world_size, batch) of earlier parts
    version: int = STATE_VERSION

    def to_dict(self) -> dict:
        d = asdict(self)
        bad = {"epoch": d.pop("bad_epoch"), "total": d.pop("bad_total")}
        d["resumed"] = [{"world_size": w, "batch": b} for w, b in self.resumed]
        return {"version": d.pop("version"), **d, "bad": bad}

    @classmethod
    def from_dict(cls, state: object) -> LoaderState:
        """The state in ``state``, checked field by field (see the module docstring)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        try:
            size = len(json.dumps(state))
        except (TypeError, ValueError) as e:
            raise ValueError(f"state must be JSON-safe: {e}") from e
        if size > _MAX_STATE_BYTES:
            raise ValueError(f"state is {size} bytes of JSON; a loader state is under 1 MiB")
        if "version" not in state:
            raise ValueError("state lacks fields ['version']")
        version = check_int("version", state["version"], minimum=0, maximum=_MAX_VERSION)
        if version not in (1, STATE_VERSION):
            raise IncompatibleStateError(
                f"version: state has version {version}, this stoker reads versions 1 and "
                f"{STATE_VERSION}"
            )
        wanted = _FIELDS if version == STATE_VERSION else _FIELDS - set(_OLD_FIELDS)
        extra = sorted(set(state) - wanted)
        if extra:
            raise ValueError(f"state has unknown fields {extra}")
        missing = sorted(wanted - set(state))
        if missing:
            raise ValueError(f"state lacks fields {missing}")
        if version == 1:
            state = {**state, **_from_sampler(state["sampler"])}
        seed = check_seed(state["seed"])
        epoch = check_int("epoch", state["epoch"], minimum=0, maximum=MAX_COUNTER)
        batch = check_int("batch", state["batch"], minimum=0, maximum=_MAX_BATCH)
        batch_size = check_batch_size(state["batch_size"])
        bad = state["bad"]
        if not isinstance(bad, dict) or set(bad) != {"epoch", "total"}:
            raise ValueError("bad must be a dict with the fields 'epoch' and 'total'")
        bad_epoch = check_int("bad.epoch", bad["epoch"], minimum=0, maximum=MAX_COUNTER)
        bad_total = check_int("bad.total", bad["total"], minimum=0, maximum=MAX_COUNTER)
        if not isinstance(state["pair"], bool):
            raise TypeError(f"pair must be a bool, got {type(state['pair']).__name__}")
        for name in ("dataset", "sampler"):
            if not isinstance(state[name], dict):
                raise TypeError(f"{name} must be a dict, got {type(state[name]).__name__}")
        world_size = check_int("world_size", state["world_size"], minimum=1, maximum=MAX_WORLD)
        if not isinstance(state["drop_last"], bool):
            raise TypeError(f"drop_last must be a bool, got {type(state['drop_last']).__name__}")
        return cls(
            dataset=state["dataset"],
            sampler=state["sampler"],
            seed=seed,
            batch_size=batch_size,
            pair=state["pair"],
            epoch=epoch,
            batch=batch,
            bad_epoch=bad_epoch,
            bad_total=bad_total,
            world_size=world_size,
            drop_last=state["drop_last"],
            resumed=_check_resumed(state["resumed"]),
            version=STATE_VERSION,
        )


def _from_sampler(sampler: object) -> dict:
    """A version 1 state's ``world_size`` and ``drop_last``, from its sampler fingerprint."""
    fp = sampler if isinstance(sampler, dict) else {}
    world, drop = fp.get("world_size", 1), fp.get("drop_last", False)
    return {"world_size": world, "drop_last": drop, "resumed": []}


def _check_resumed(value: object) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, list):
        raise TypeError(f"resumed must be a list, got {type(value).__name__}")
    if len(value) > MAX_RESUMED:
        raise ValueError(
            f"resumed lists {len(value)} earlier parts of the epoch; a state holds at most "
            f"{MAX_RESUMED}"
        )
    out = []
    for i, part in enumerate(value):
        if not isinstance(part, dict) or set(part) != {"world_size", "batch"}:
            raise ValueError(f"resumed[{i}] must be a dict with the fields 'world_size', 'batch'")
        w = check_int(f"resumed[{i}].world_size", part["world_size"], minimum=1, maximum=MAX_WORLD)
        b = check_int(f"resumed[{i}].batch", part["batch"], minimum=0, maximum=_MAX_BATCH)
        out.append((w, b))
    return tuple(out)


# the top-level keys of a state: those to_dict writes
_BLANK: dict[str, Any] = {**dict.fromkeys(f.name for f in fields(LoaderState)), "resumed": ()}
_FIELDS = frozenset(LoaderState(**_BLANK).to_dict())
