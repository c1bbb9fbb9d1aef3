"""Run in a child process by the LMDB damage tests: ``stoker.Loader`` over a database with
``workers=0`` and then ``workers=2``; prints one JSON line per run (what was delivered, the
rejects, or the error raised). A crash of this process is what the tests rule out.

    python _lmdb_load_child.py DB ON_ERROR
"""

from __future__ import annotations

import json
import sys

import stoker


def run(db: str, workers: int, on_error: str) -> dict:
    out: dict = {"workers": workers}
    try:
        kw = dict(batch_size=16, workers=workers, on_error=on_error, max_bad_fraction=1.0)
        with stoker.Loader(db, **kw) as ld:  # type: ignore[arg-type]
            out["indices"] = [int(i) for b in ld for i in b.indices]
            out["rejects"] = [(r["index"], r["reason"]) for r in ld.rejects]
    except Exception as e:  # noqa: BLE001 - the test looks at what was raised
        out["error"] = type(e).__name__
        out["stoker"] = isinstance(e, stoker.StokerError)
        out["message"] = str(e)
    return out


if __name__ == "__main__":
    for w in (0, 2):
        print(json.dumps(run(sys.argv[1], w, sys.argv[2])), flush=True)
