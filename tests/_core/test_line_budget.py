"""The line budget in `make lint` counts `src/stoker` per room against the recorded start and
fails only past the budget; the record it ships with matches the tree it was taken from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "line_budget.py"


def _run(root: Path, record: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), "--record", str(record)],
        capture_output=True,
        text=True,
        check=False,
    )


def _tree(tmp_path: Path, rooms: dict[str, int], budget: int) -> tuple[Path, Path]:
    pkg = tmp_path / "src" / "stoker"
    (pkg / "formats" / "wds").mkdir(parents=True)
    (pkg / "pipeline.py").write_text("x = 1\n" * 10)
    (pkg / "formats" / "a.py").write_text("x = 1\n" * 20)
    (pkg / "formats" / "wds" / "b.py").write_text("x = 1\n" * 5)
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"commit": "abc1234", "budget": budget, "rooms": rooms}))
    return tmp_path, record


def test_growth_within_the_budget_passes_and_prints_each_room(tmp_path):
    root, record = _tree(tmp_path, {"pipeline": 10, "formats": 20}, budget=5)
    r = _run(root, record)
    assert r.returncode == 0, r.stdout
    assert "formats" in r.stdout and "+5" in r.stdout  # a sub-folder counts in its room
    assert "within the budget of +5" in r.stdout


def test_growth_past_the_budget_fails(tmp_path):
    root, record = _tree(tmp_path, {"pipeline": 10, "formats": 20}, budget=4)
    r = _run(root, record)
    assert r.returncode == 1
    assert "OVER the budget of +4" in r.stdout


def test_a_room_that_went_away_counts_as_shrinking(tmp_path):
    root, record = _tree(tmp_path, {"pipeline": 10, "formats": 25, "old": 100}, budget=0)
    r = _run(root, record)
    assert r.returncode == 0
    assert "-100" in r.stdout


def test_the_recorded_start_is_the_tree_at_its_commit():
    """The shipped record names a commit: the counts are that commit's `src/stoker`."""
    record = json.loads((ROOT / "scripts" / "line_budget.json").read_text())
    commit = record["commit"]
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", commit, "src/stoker"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    names = [n for n in names if n.endswith(".py")]
    batch = subprocess.run(
        ["git", "cat-file", "--batch"],
        input="".join(f"{commit}:{n}\n" for n in names).encode(),
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    counted: dict[str, int] = {}
    pos = 0
    for name in names:  # each object: "<sha> blob <size>\n<body>\n"
        header_end = batch.index(b"\n", pos)
        size = int(batch[pos:header_end].split()[2])
        body = batch[header_end + 1 : header_end + 1 + size]
        pos = header_end + 1 + size + 1
        parts = Path(name).relative_to("src/stoker").parts
        room = parts[0] if len(parts) > 1 else Path(parts[0]).stem
        counted[room] = counted.get(room, 0) + body.count(b"\n")
    assert counted == record["rooms"]
