"""The size check in `make lint` flags long modules and long functions, and only those."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_size.py"


def _tree(tmp_path: Path, module: str) -> Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "m.py").write_text(module)
    return tmp_path


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root)], capture_output=True, text=True
    )


def test_a_function_over_the_limit_fails(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    root = _tree(tmp_path, "def long():\n" + body)
    r = _run(root)
    assert r.returncode == 1
    assert "function long is 101 lines" in r.stdout


def test_a_docstring_does_not_count(tmp_path):
    doc = '    """' + "\n".join(["doc"] * 50) + '"""\n'
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    root = _tree(tmp_path, "def documented():\n" + doc + body)
    assert _run(root).returncode == 0


def test_a_module_over_600_lines_fails(tmp_path):
    root = _tree(tmp_path, "x = 1\n" * 601)
    r = _run(root)
    assert r.returncode == 1
    assert "601 lines (limit 600)" in r.stdout
