"""`make demo`: runs each numbered stage in scripts/demo/ in order, on data it makes itself.

Each stage is a script ``NN_name.py`` that takes the working directory as its only argument
and prints what it did and how fast. Stages share that directory (sample data, packed shards).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    work = Path(os.environ.get("STOKER_DEMO_DIR", "demo-data")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    stages = sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))
    t_all = time.perf_counter()
    for stage in stages:
        title = stage.stem[3:].replace("_", " ")
        print(f"\n=== {stage.stem[:2]} {title} ===", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, str(stage), str(work)])
        if rc != 0:
            print(f"demo stage {stage.name} failed with exit code {rc}", file=sys.stderr)
            return rc
        print(f"--- {title}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"\ndemo finished in {time.perf_counter() - t_all:.1f} s; files in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
