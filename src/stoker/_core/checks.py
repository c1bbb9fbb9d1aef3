"""Argument checks shared by every room.

Each check returns the normalised value or raises the builtin a Python user expects:
``TypeError`` for a value of the wrong type, ``ValueError`` for one out of range, with a
message that names the argument.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection, Iterable, Mapping
from typing import Any

__all__ = [
    "refuse_unknown",
    "check_choice",
    "check_epoch",
    "check_int",
    "check_optional_int",
    "check_rank",
    "check_seed",
]

_SEED_MAX = (1 << 63) - 1


def check_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    """``value`` as an ``int`` in ``[minimum, maximum]``.

    Bools, floats and strings are refused; numpy integers are accepted.
    """
    return _checked_int(name, value, minimum, maximum, "")


def check_optional_int(
    name: str, value: object, *, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    """:func:`check_int` that lets ``None`` through unchanged (an option left at its default)."""
    return None if value is None else _checked_int(name, value, minimum, maximum, " or None")


def _checked_int(
    name: str, value: object, minimum: int | None, maximum: int | None, alternative: str
) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int{alternative}, got {type(value).__name__} {value!r}")
    out = int(value)
    if minimum is not None and out < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {out}")
    if maximum is not None and out > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {out}")
    return out


def check_choice(name: str, value: object, choices: Collection[str]) -> str:
    """``value`` when it is one of ``choices``; the message lists them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_rank(rank: object, world_size: object) -> tuple[int, int]:
    """``(rank, world_size)`` with ``0 <= rank < world_size``."""
    w = check_int("world_size", world_size, minimum=1)
    r = check_int("rank", rank)
    if not 0 <= r < w:
        raise ValueError(f"rank must be in [0, world_size={w}), got {r}")
    return r, w


def check_seed(seed: object) -> int:
    """A seed every rank and a resumed run can share: an int in ``[0, 2**63)``."""
    if seed is None:
        raise TypeError(
            "seed must be an int: every rank and a resumed run must draw the same order "
            "(stoker.Loader draws one for you when you give it seed=None and no sampler)"
        )
    return check_int("seed", seed, minimum=0, maximum=_SEED_MAX)


def check_epoch(epoch: object) -> int:
    """An epoch number: an int >= 0."""
    return check_int("epoch", epoch, minimum=0)


def refuse_unknown(
    owner: str,
    given: Mapping[str, Any],
    known: Iterable[str],
    hints: Mapping[str, str] | None = None,
) -> None:
    """A ``TypeError`` for the first keyword in ``given`` that ``owner`` does not take, naming
    what to write instead: ``hints[name]`` (another library's habit, e.g. DataLoader's
    ``num_workers``) or the closest known name."""
    if not given:
        return
    import difflib

    name = next(iter(given))
    hint = (hints or {}).get(name)
    if hint is None:
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}=?" if close else "see help(" + owner + ")"
    raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}: {hint}")
