"""Run in a child process by the LMDB fuzz test: one (possibly damaged) database through
``verify``, ``stoker inspect`` and ``stoker.Loader`` (``on_error="skip"``), one JSON line per
tool as it finishes, so a crash names the tool it happened in.

    python _lmdb_fuzz_child.py DB WORKERS

Each line: ``{"tool", "outcome", "detail"}``; outcome ``"error"`` (a StokerError, or a report or
exit code that says what is wrong, naming the database), ``"ok"`` (finished without an error;
for the Loader ``detail`` is a digest of what it delivered) or ``"bad"`` (another exception, or
an error that does not name the database).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sys

import stoker
from stoker.cli import main as cli
from stoker.formats.lmdb import verify


def emit(tool: str, outcome: str, detail: str = "") -> None:
    print(json.dumps({"tool": tool, "outcome": outcome, "detail": detail[:300]}), flush=True)


def named(db: str, text: str) -> str:
    return "error" if db in text else "bad"


def run(db: str, workers: int) -> None:
    try:
        report = verify(db)
        text = "\n".join(str(p) for p in report.problems)
        emit("verify", "ok" if report.ok else named(db, text), text)
    except Exception as e:  # noqa: BLE001 - any other exception is a finding
        emit("verify", "bad", f"{type(e).__name__}: {e}")

    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli(["inspect", db])
        lines = err.getvalue().strip().splitlines()
        if code == 0:
            emit("inspect", "ok")
        elif code == 1 and not lines and "unreadable:" in out.getvalue():
            emit("inspect", named(db, out.getvalue()), out.getvalue())  # records it could not read
        elif code == 1 and len(lines) == 1:
            emit("inspect", named(db, lines[0]), lines[0])
        else:
            emit("inspect", "bad", f"exit {code}: {err.getvalue()[-300:]}")
    except Exception as e:  # noqa: BLE001
        emit("inspect", "bad", f"{type(e).__name__}: {e}")

    try:
        kw = dict(batch_size=32, workers=workers, on_error="skip", max_bad_fraction=1.0)
        h = hashlib.sha256()
        with stoker.Loader(db, **kw) as ld:  # type: ignore[arg-type]
            for b in ld:
                h.update(b.indices.tobytes())
                h.update(b.images.tobytes())
            rejects = list(ld.rejects)
        if rejects:  # skipped and reported, each naming its sample
            emit("loader", "error", rejects[0]["reason"])
        else:
            emit("loader", "ok", h.hexdigest())
    except stoker.StokerError as e:
        emit("loader", named(db, str(e)), str(e))
    except Exception as e:  # noqa: BLE001
        emit("loader", "bad", f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]))
