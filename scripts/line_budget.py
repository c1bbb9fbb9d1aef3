"""Print the lines of ``src/stoker`` per room against the counts recorded when this wave began,
and fail when the net growth is past the wave's budget.

A room is a top-level package under ``src/stoker`` (``formats``, ``loader``, ...) or a top-level
module (``pipeline``); lines are physical lines of ``*.py`` files, as ``wc -l`` counts them. The
starting counts, the commit they were taken at and the budget live in ``line_budget.json``
beside this script; a new wave records new ones there.

Run by ``make lint``; exits 1 past the budget.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECORD = HERE / "line_budget.json"


def room_lines(package: Path) -> dict[str, int]:
    """Lines per room under ``package`` (the ``src/stoker`` folder)."""
    rooms: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        room = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        with open(path, "rb") as f:
            rooms[room] = rooms.get(room, 0) + f.read().count(b"\n")
    return rooms


def report(now: dict[str, int], start: dict[str, int], budget: int) -> tuple[list[str], bool]:
    """The table's lines and whether the total is within the budget."""
    width = max(len(r) for r in {*now, *start, "total"})
    lines = [f"{'room':<{width}}  {'start':>7}  {'now':>7}  {'change':>7}"]
    for room in sorted({*now, *start}):
        a, b = start.get(room, 0), now.get(room, 0)
        lines.append(f"{room:<{width}}  {a:>7,}  {b:>7,}  {b - a:>+7,}")
    total_a, total_b = sum(start.values()), sum(now.values())
    growth = total_b - total_a
    lines.append(f"{'total':<{width}}  {total_a:>7,}  {total_b:>7,}  {growth:>+7,}")
    ok = growth <= budget
    verdict = "within" if ok else "OVER"
    lines.append(f"net growth {growth:+,} lines: {verdict} the budget of {budget:+,}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=HERE.parent, help="the repository's root")
    ap.add_argument("--record", type=Path, default=RECORD, help="the recorded start and budget")
    args = ap.parse_args(argv)
    record = json.loads(args.record.read_text(encoding="utf-8"))
    now = room_lines(args.root / "src" / "stoker")
    lines, ok = report(now, record["rooms"], int(record["budget"]))
    print(f"src/stoker lines per room, against {record['commit']} (the start of this wave)")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
