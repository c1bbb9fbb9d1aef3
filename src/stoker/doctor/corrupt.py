"""The corrupt-data finding: the samples that did not read or decode, named as the loader names
them, what training would do with them, and how much of the set was checked.

The doctor finds them in two places: its own sample (the storage stage reads and the decode
stage decodes every sampled item) and the loader runs (run with ``on_error="skip"``, they skip what does not decode and
say which key). Neither reads every sample of a large set, so the finding says how many were
checked and which command checks the rest.
"""

from __future__ import annotations

import math
from typing import Any

from stoker.doctor.findings import Findings

__all__ = ["DATA_ERRORS", "corrupt_data", "kind_of", "loader_max_bad_fraction"]

#: corrupt samples named in the text (all of them are in the JSON)
_NAMED = 5


def loader_max_bad_fraction() -> float:
    """The Loader's default ``max_bad_fraction``: with ``on_error="skip"``, an epoch with more
    bad samples than this share of it stops."""
    try:
        import inspect

        from stoker.loader import Loader

        return float(inspect.signature(Loader).parameters["max_bad_fraction"].default)
    except Exception:  # noqa: BLE001 - the loader's room is not installed
        return 0.001


#: errors that mean the sample's bytes are bad (or cannot be read), not the pipeline
DATA_ERRORS = frozenset(
    {
        "ImageDecodeError",
        "ImageTooLargeError",
        "StokerFormatError",
        "CorruptRecordError",
        "IndexFormatError",
        "OSError",
        "FileNotFoundError",
        "PermissionError",
        "IsADirectoryError",
        "EOFError",
    }
)


def kind_of(reason: str) -> str:
    """``"corrupt"`` when ``reason`` ("Type: message") is a data error, else ``"pipeline"``
    (the sample's bytes decoded, a transform or a shape check failed on it)."""
    return "corrupt" if reason.split(":", 1)[0].strip() in DATA_ERRORS else "pipeline"


def corrupt_data(f: Findings) -> dict[str, Any]:
    """The report's ``corrupt`` section (schema in :mod:`stoker.doctor.report`)."""
    count = f.sample.count
    by_decode = f.sample.sampled
    by_loader = min(count, max((r.seen for r in f.loader.runs), default=0))
    exhaustive = max(by_decode, by_loader) >= count
    fraction = loader_max_bad_fraction()
    found = sorted(f.corrupt, key=lambda c: (c.key is None, c.key or 0, c.where))
    items = [{**c.to_dict(), "kind": kind_of(c.reason)} for c in found]
    unit = "file" if f.sample.kind == "folder" else "record"
    data: dict[str, Any] = {
        "count": sum(1 for c in items if c["kind"] == "corrupt"),
        "failed": sum(1 for c in items if c["kind"] == "pipeline"),
        "unit": unit,
        "items": items,
        "checked": {"decode": by_decode, "loader": by_loader, "of": count},
        "exhaustive": exhaustive,
        "max_bad_fraction": fraction,
        "allowed_per_epoch": math.floor(fraction * count),
        "text": "",
    }
    if items:
        data["text"] = _text(data, f.sample.kind)
    return data


def _named(items: list[dict[str, Any]]) -> str:
    named = "; ".join(f"{c['where']}: {c['reason']}" for c in items[:_NAMED])
    if len(items) > _NAMED:
        named += f"; and {len(items) - _NAMED} more (all in the JSON report)"
    return named


def _text(d: dict[str, Any], kind: str) -> str:
    unit, items = d["unit"], d["items"]
    bad = [c for c in items if c["kind"] == "corrupt"]
    failed = [c for c in items if c["kind"] == "pipeline"]
    stop = "training with on_error='raise' (the Loader's default) would stop at"
    parts = []
    if len(bad) == 1:
        parts.append(f"1 corrupt {unit}: {stop} {_named(bad)}.")
    elif bad:
        parts.append(
            f"{len(bad)} corrupt {unit}s: {stop} the first of them it reaches: {_named(bad)}."
        )
    if failed:
        parts.append(
            f"{len(failed)} sample(s) decoded but failed in the pipeline (a transform or a shape "
            f"check, not their bytes): {stop} them{' too' if bad else ''}: {_named(failed)}."
        )
    c = d["checked"]
    if d["exhaustive"]:
        parts.append(f"Every one of the {c['of']:,} samples was checked.")
    else:
        where = (
            "`stoker pack` checks every file and lists the bad ones in NAME.rejects.tsv"
            if kind == "folder"
            else "`stoker verify --decode` checks every record"
        )
        parts.append(
            f"Only part of the set was checked (the doctor's sample of {c['decode']:,} and "
            f"{c['loader']:,} samples read by the loader runs, of {c['of']:,}), so there may "
            f"be more: {where}."
        )
    n, allowed = len(items), d["allowed_per_epoch"]
    found = f"{n} {'was' if n == 1 else 'were'} found"
    parts.append(
        "The loader was measured with on_error='skip', which leaves them out; it still stops "
        f"an epoch once more than max_bad_fraction={d['max_bad_fraction']:g} of its samples are "
        f"bad (here {allowed:,} of {c['of']:,} are allowed, and {found})"
        + (
            (
                ": replace or remove them, or pass a larger max_bad_fraction."
                if bad
                else ": fix the pipeline for them, or pass a larger max_bad_fraction."
            )
            if n > allowed
            else "."
        )
    )
    return " ".join(parts)
