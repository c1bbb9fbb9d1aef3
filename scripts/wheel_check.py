"""Build stoker's wheel and sdist, install the wheel alone into a fresh venv, and use it.

What it catches: a module or data file the wheel leaves out (every ``src/stoker/**/*.py`` must
be in it), an import of a package the core dependencies do not bring, a console script that
does not start, and a core install that pulls torch (or any CUDA library) along.

Steps, each timed:

1. ``python -m build --sdist --wheel`` into a temporary folder (an isolated build, as a user's
   ``pip install`` from the sdist would run it);
2. a fresh venv (``python -m venv``) and ``pip install WHEEL``: the core dependencies only;
3. in a folder outside the checkout (so that nothing imports from ``src/``): ``stoker
   sample-data``, ``stoker pack``, a ``stoker.Loader`` epoch, ``stoker inspect --json``, each
   checked for what it must give.

``make wheel-check`` runs it (``.ci/run`` too); ``--keep DIR`` leaves the venv and files in
``DIR`` for a look. Exits 1 with one line naming the failed step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: distributions a core install must never bring (torch is an extra; CUDA comes with it)
FORBIDDEN = ("torch", "tensorflow", "keras", "jax")

#: what the smoke run makes: classes x images per class, at this size
CLASSES, PER_CLASS, SIZE = 3, 4, 64

LOAD = """
import sys
import numpy as np
import stoker

def main():
    seen = 0
    with stoker.Loader(sys.argv[1], batch_size=4, workers=2, drop_last=False) as loader:
        for images, labels in loader:
            assert images.dtype == np.uint8 and images.shape[1:] == (64, 64, 3), images.shape
            seen += int(images.shape[0])
    print(seen)

if __name__ == "__main__":
    main()
"""


class CheckFailed(Exception):
    """A step did not give what it must."""


def _run(step: str, cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``; its stdout, or :class:`CheckFailed` with its stderr's last lines."""
    got = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if got.returncode != 0:
        tail = "\n".join((got.stderr or got.stdout).strip().splitlines()[-15:])
        raise CheckFailed(f"{step}: `{' '.join(cmd)}` exited {got.returncode}\n{tail}")
    return got.stdout


def _build(dist: Path) -> tuple[Path, Path]:
    """The wheel and the sdist, built from the checkout into ``dist``."""
    _run("build", [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)], ROOT)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise CheckFailed(
            f"build: expected one wheel and one sdist in {dist}, got {wheels + sdists}"
        )
    return wheels[0], sdists[0]


def _check_contents(wheel: Path) -> int:
    """Every module under ``src/stoker`` and ``py.typed`` is in the wheel; how many files it has."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    src = ROOT / "src"
    want = {p.relative_to(src).as_posix() for p in (src / "stoker").rglob("*.py")}
    want.add("stoker/py.typed")
    missing = sorted(want - names)
    if missing:
        raise CheckFailed(f"wheel contents: {wheel.name} lacks {missing[:5]} ({len(missing)})")
    return len(names)


def _install(venv: Path, wheel: Path) -> list[str]:
    """A fresh venv with the wheel and its core dependencies; the distributions it holds."""
    _run("venv", [sys.executable, "-m", "venv", str(venv)], venv.parent)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    _run("install", [*pip, "install", "-q", "--disable-pip-version-check", str(wheel)], venv.parent)
    listed = json.loads(_run("pip list", [*pip, "list", "--format", "json"], venv.parent))
    names = sorted(d["name"].lower() for d in listed)
    pulled = [n for n in names if n in FORBIDDEN or n.startswith("nvidia-")]
    if pulled:
        raise CheckFailed(f"install: the core install pulled {pulled}; they belong in an extra")
    return names


def _smoke(venv: Path, work: Path) -> dict[str, object]:
    """sample-data → pack → load → inspect with the installed wheel, outside the checkout."""
    bindir = venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    stoker = str(bindir / "stoker")
    images, prefix = work / "images", work / "sets" / "train"
    args = ["--classes", str(CLASSES), "--per-class", str(PER_CLASS), "--size", str(SIZE)]
    _run("sample-data", [stoker, "sample-data", str(images), *args, "--workers", "1"], work, env)
    _run("pack", [stoker, "pack", str(images), str(prefix), "--quiet", "--workers", "2"], work, env)
    manifest = f"{prefix}.stoker.json"
    script = work / "load.py"
    script.write_text(LOAD)
    loaded = int(_run("load", [str(bindir / "python"), str(script), manifest], work, env))
    n = CLASSES * PER_CLASS
    if loaded != n:
        raise CheckFailed(f"load: one epoch gave {loaded} images, the set holds {n}")
    report = json.loads(_run("inspect", [stoker, "inspect", manifest, "--json"], work, env))
    if report.get("records") != n:
        raise CheckFailed(f"inspect: {manifest} reports {report.get('records')} records, not {n}")
    imported = _run(
        "where", [str(bindir / "python"), "-c", "import stoker; print(stoker.__file__)"], work, env
    )
    if not imported.strip().startswith(str(venv)):
        raise CheckFailed(f"where: stoker was imported from {imported.strip()}, not the venv")
    return {"images": n, "loaded": loaded, "records": report.get("records")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keep", default=None, metavar="DIR", help="work in DIR and leave it there")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stoker-wheel-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        times: dict[str, float] = {}
        try:
            t = time.perf_counter()
            wheel, sdist = _build(work / "dist")
            files = _check_contents(wheel)
            times["build"] = time.perf_counter() - t
            t = time.perf_counter()
            dists = _install(work / "venv", wheel)
            times["install"] = time.perf_counter() - t
            t = time.perf_counter()
            got = _smoke(work / "venv", work)
            times["smoke"] = time.perf_counter() - t
        except CheckFailed as e:
            print(f"wheel-check: FAILED {e}", file=sys.stderr)
            return 1
    took = ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
    print(
        f"wheel-check: ok: {wheel.name} ({files} files) and {sdist.name}; a fresh venv with "
        f"{len(dists)} distributions ({', '.join(dists)}); packed, loaded and inspected "
        f"{got['images']} images; {took}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
