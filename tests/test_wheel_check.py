"""``make wheel-check`` (scripts/wheel_check.py): the wheel a user installs holds every module,
installs with the core dependencies alone, and packs, loads and inspects a set."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "wheel_check.py"


def _script():
    spec = importlib.util.spec_from_file_location("wheel_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _wheel(path: Path, names: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for n in names:
            z.writestr(n, "")
    return path


def test_a_wheel_without_a_module_fails_the_check(tmp_path):
    wc = _script()
    src = ROOT / "src"
    modules = sorted(p.relative_to(src).as_posix() for p in (src / "stoker").rglob("*.py"))
    whole = _wheel(tmp_path / "whole.whl", [*modules, "stoker/py.typed"])
    assert wc._check_contents(whole) == len(modules) + 1
    dropped = "stoker/formats/recordio/insightface.py"
    short = _wheel(
        tmp_path / "short.whl", [m for m in modules if m != dropped] + ["stoker/py.typed"]
    )
    with pytest.raises(wc.CheckFailed, match="insightface.py"):
        wc._check_contents(short)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_built_wheel_installs_alone_and_packs_loads_and_inspects():
    got = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=580
    )
    assert got.returncode == 0, got.stderr[-3000:]
    assert "wheel-check: ok" in got.stdout
    assert "packed, loaded and inspected 12 images" in got.stdout
    assert "torch" not in got.stdout.split("distributions (")[1].split(")")[0]
