"""Run in a child process by F-14 (``test_f14_outcomes.py``): one (possibly damaged) set of any
format through ``stoker verify --decode``, ``stoker inspect`` and ``stoker.Loader``
(``on_error="skip"``), one JSON line per tool as it finishes, so a crash names the tool it
happened in.

    python _outcome_child.py SET WORKERS

Each line: ``{"tool", "outcome", "detail"}``; outcome ``"error"`` (an exit code or exception
that says what is wrong, naming a file of the set), ``"ok"`` (finished without an error; for
the Loader ``detail`` is a digest of what it delivered) or ``"bad"`` (another exception, a
traceback, or an error that names no file of the set).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys

import stoker
from stoker.cli import main as cli


def emit(tool: str, outcome: str, detail: str = "") -> None:
    print(json.dumps({"tool": tool, "outcome": outcome, "detail": detail[:300]}), flush=True)


def named(folder: str, text: str) -> str:
    """``"error"`` when ``text`` names a file of the set's folder, else ``"bad"``."""
    files = [n for n in os.listdir(folder) if not n.startswith(".")]
    return "error" if any(n in text for n in files) else "bad"


def _cli(tool: str, args: list[str], folder: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli(args)
    except SystemExit as e:  # argparse only
        code = e.code if isinstance(e.code, int) else 2
    except Exception as e:  # noqa: BLE001 - any exception out of the CLI is a finding
        emit(tool, "bad", f"{type(e).__name__}: {e}")
        return
    text = out.getvalue() + err.getvalue()
    if code == 0:
        emit(tool, "ok")
    elif code == 1 and "Traceback" not in text:
        emit(tool, named(folder, text), text.strip()[-300:])
    else:
        emit(tool, "bad", f"exit {code}: {text[-300:]}")


def run(path: str, workers: int) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    _cli("verify", ["verify", "--decode", path], folder)
    _cli("inspect", ["inspect", path], folder)
    try:
        kw = dict(batch_size=8, workers=workers, on_error="skip", max_bad_fraction=1.0)
        h = hashlib.sha256()
        with stoker.Loader(path, **kw) as ld:  # type: ignore[arg-type]
            for b in ld:
                h.update(b.indices.tobytes())
                h.update(b.images.tobytes())
                h.update(json.dumps([int(x) for x in b.labels]).encode())
            rejects = list(ld.rejects)
        if rejects:  # skipped and reported, each naming its sample
            emit("loader", "error", rejects[0]["reason"])
        else:
            emit("loader", "ok", h.hexdigest())
    except stoker.StokerError as e:
        emit("loader", named(folder, str(e)), str(e))
    except Exception as e:  # noqa: BLE001
        emit("loader", "bad", f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]))
