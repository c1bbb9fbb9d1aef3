"""How each bad-input case is run and judged (figure F-01; docs/reliability.md).

A case is *handled* when its entry point ends in a documented error: a ``StokerError``
subclass (the CLI: a non-zero exit with one clear line instead of a traceback) whose message
names one of the case's files and matches one of its ``where`` patterns (a byte offset, an
``.idx`` line, a key, or for a whole-file problem the field at fault). ``verify_records`` does
not raise for bad data: there a reported problem must name the file and place.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker._core.errors import StokerError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "make_fault_corpus.py"


def load_corpus_module():
    """``scripts/make_fault_corpus.py`` as the module ``make_fault_corpus``."""
    mod = sys.modules.get("make_fault_corpus")
    if mod is None:
        spec = importlib.util.spec_from_file_location("make_fault_corpus", SCRIPT)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["make_fault_corpus"] = mod
        spec.loader.exec_module(mod)
    return mod


#: The error types a case may end in besides ``StokerError`` subclasses, by case option.
ALLOWED_BUILTINS: dict[str, tuple[type[BaseException], ...]] = {}


@dataclass(frozen=True)
class Outcome:
    ok: bool
    detail: str


def _names(case: Any, message: str) -> str | None:
    """``None`` when ``message`` names a file of ``case`` and its place; else what is missing."""
    if not any(n in message for n in case.names):
        return f"message names none of {case.names}"
    if not any(re.search(w, message) for w in case.where):
        return f"message matches none of {case.where}"
    return None


def judge_error(case: Any, e: BaseException) -> Outcome:
    msg = str(e)
    if not isinstance(e, StokerError):
        return Outcome(False, f"undocumented error type {type(e).__name__}: {msg[:300]}")
    missing = _names(case, msg)
    if missing:
        return Outcome(False, f"{type(e).__name__} but {missing}: {msg[:300]}")
    return Outcome(True, f"{type(e).__name__}: {msg[:200]}")


def _read(case: Any, path: str, *, checksums: bool) -> Outcome:
    from stoker.formats.recordio.seam import RecordIOReader

    try:
        r = RecordIOReader(path, checksums=checksums)  # an insightface layout is checked here
        try:
            for i in range(len(r)):
                r.read(i)
            r.labels()
        finally:
            r.close()
    except Exception as e:  # noqa: BLE001 - judged
        return judge_error(case, e)
    return Outcome(False, "no error: every record read")


def _verify(case: Any, path: str) -> Outcome:
    from stoker.formats.recordio import verify_records

    try:
        report = verify_records(path, checksums=True, progress=False)
    except Exception as e:  # noqa: BLE001 - judged
        return judge_error(case, e)
    if report.ok:
        return Outcome(False, f"verify found no problem ({report.summary()}; {report.notes})")
    texts = [str(p) for p in report.problems]
    for t in texts:
        if _names(case, t) is None:
            return Outcome(True, t[:200])
    return Outcome(False, f"no problem names the file and place: {texts[:3]}")


def _loader(case: Any, path: str) -> Outcome:
    import stoker
    from stoker.transforms import Resize

    try:
        with stoker.Loader(path, batch_size=2, transforms=Resize(16), workers=0) as loader:
            for _ in loader:
                pass
    except Exception as e:  # noqa: BLE001 - judged
        return judge_error(case, e)
    return Outcome(False, "no error: the epoch ran through")


_BOMB_CHILD = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import stoker
from stoker._core.errors import StokerError
from stoker.transforms import Resize
try:
    with stoker.Loader(sys.argv[1], batch_size=2, transforms=Resize(16), workers=0) as loader:
        for _ in loader:
            pass
    out = {"type": None, "stoker": False, "message": "no error"}
except BaseException as e:
    out = {"type": type(e).__name__, "stoker": isinstance(e, StokerError), "message": str(e)}
print("RESULT " + json.dumps(out))
"""


def _loader_bomb(case: Any, path: str) -> Outcome:
    """A decompression bomb for the loader, run in a child under a 3 GiB address-space limit
    (a decoder that believes the header would otherwise take gigabytes of a shared machine)."""
    proc = subprocess.run(
        [sys.executable, "-c", _BOMB_CHILD, path],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return Outcome(False, f"child died (rc {proc.returncode}): {proc.stderr[-300:]}")
    out = json.loads(lines[-1][7:])
    if out["type"] is None:
        return Outcome(False, "no error: the epoch ran through")
    if not out["stoker"]:
        return Outcome(False, f"undocumented error type {out['type']}: {out['message'][:300]}")
    missing = _names(case, out["message"])
    if missing:
        return Outcome(False, f"{out['type']} but {missing}: {out['message'][:300]}")
    return Outcome(True, f"{out['type']}: {out['message'][:200]}")


def _cli(case: Any, argv: list[str]) -> Outcome:
    from stoker.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception as e:  # noqa: BLE001 - an escaping exception is a traceback for the user
        return Outcome(False, f"traceback: {type(e).__name__}: {str(e)[:300]}")
    text = out.getvalue() + err.getvalue()
    if rc == 0:
        return Outcome(False, f"exit 0: {text[-300:]}")
    missing = _names(case, text)
    if missing:
        return Outcome(False, f"exit {rc} but {missing}: {text[-300:]}")
    return Outcome(True, f"exit {rc}: {text.strip().splitlines()[-1][:200]}")


def _unpack(case: Any, path: str, out_dir: Path) -> Outcome:
    outcome = _cli(case, ["unpack", path, str(out_dir), "--quiet"])
    written = [p for p in out_dir.rglob("*") if p.is_file()] if out_dir.exists() else []
    escaped = [p for p in ("/tmp/stoker-evil", str(out_dir.parent / "x")) if os.path.exists(p)]
    if written or escaped:
        return Outcome(False, f"files written: {written[:3]} {escaped}")
    return outcome


def run_case(case: Any, root: Path, tmp: Path) -> Outcome:
    """Run ``case`` (a ``make_fault_corpus.Case``) against the corpus under ``root``."""
    path = str(root / case.target)
    entry = case.entry
    if entry in ("read", "read-nocrc"):
        return _read(case, path, checksums=entry == "read")
    if entry == "verify":
        return _verify(case, path)
    if entry == "loader":
        return _loader_bomb(case, path) if case.extra.get("bomb") else _loader(case, path)
    if entry == "cli-verify":
        return _cli(case, ["verify", path, "--quiet"])
    if entry == "cli-inspect":
        return _cli(case, ["inspect", path])
    if entry == "cli-unpack":
        return _unpack(case, path, tmp / "unpacked")
    raise ValueError(f"unknown entry {entry!r}")


# --------------------------------------------------------------------------- pack


@dataclass(frozen=True)
class PackRun:
    rejects: dict[str, str]  # relative path -> "reason\tdetail"
    error: str | None
    written: int


def pack_once(src: Path, out: Path) -> PackRun:
    """One ``stoker.pack`` over the whole bad-image folder."""
    import stoker

    try:
        report = stoker.pack(str(src), str(out / "packed"), workers=1, progress=False)
    except Exception as e:  # noqa: BLE001 - reported per case
        return PackRun({}, f"{type(e).__name__}: {e}", 0)
    rejects: dict[str, str] = {}
    with open(report.rejects_path, encoding="utf-8") as f:
        for line in f.read().splitlines()[1:]:
            parts = line.split("\t")
            if len(parts) >= 3:
                rejects[parts[1]] = "\t".join(parts[2:])
    return PackRun(rejects, None, report.written)


def judge_pack(case: Any, run: PackRun) -> Outcome:
    if run.error is not None:
        return Outcome(False, f"pack raised {run.error[:300]}")
    rel = case.extra["file"]
    row = run.rejects.get(rel)
    if row is None:
        if case.extra.get("packed_ok"):
            return Outcome(True, "packed (a decodable image: allowed for this case)")
        return Outcome(False, f"{rel} not in the rejects file (packed as an image)")
    reason = row.split("\t")[0]
    if not re.fullmatch(r"[a-z_]+", reason):
        return Outcome(False, f"reject row without a reason token: {row[:200]}")
    return Outcome(True, f"rejected {rel}: {row[:200]}")
