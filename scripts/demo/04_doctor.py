"""Demo stage 05: the doctor's verdict on the sample data: why would the GPU wait, and what to
change, measured on this machine.

It runs ``stoker doctor`` twice: on the image folder (WORK/images) and on the packed file
(WORK/train.rec), both with the seed-000 chain (resize 146, random crop 128, flip, normalise)
and an assumed model step of 25 ms per batch of 64 (2,560 images/s; give your own with
``--step-time`` or ``--model``). It prints the folder's full report, the packed file's verdict,
and writes WORK/doctor.json and WORK/doctor.png.

Usage: python scripts/demo/04_doctor.py WORK   (earlier stages leave WORK/images and
WORK/train.rec; when they are missing this stage makes a small set).
"""

from __future__ import annotations

import sys
from pathlib import Path

from _data import ensure_data

STEP_MS = 25.0
BATCH = 64
WORKERS = 2
# the doctor's budget, after start-up: this small, the measurements are short, their intervals
# wide, and the report says the budget ran out
SECONDS = 2.0


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    work = Path(sys.argv[1])
    work.mkdir(parents=True, exist_ok=True)
    images, rec = ensure_data(work)

    from stoker.doctor import diagnose
    from stoker.doctor.verdict import headline

    options = dict(
        transforms="seed000",
        batch_size=BATCH,
        step_time_ms=STEP_MS,
        workers_max=WORKERS,
        seconds=SECONDS,
        progress=False,
    )
    folder = diagnose(images, **options)
    print(folder.render())
    (work / "doctor.json").write_text(folder.to_json())
    folder.plot(work / "doctor.png")
    print(f"\nreport: {work / 'doctor.json'}, chart: {work / 'doctor.png'}")

    packed = diagnose(rec, **options)
    v = packed.data["verdict"]
    print(f"\nThe same on the packed file {rec}:")
    print(f"  Verdict: {headline(v)}.")
    print(f"  {v['text']}")
    f_rate = folder.data["verdict"]["loader_rate"]
    p_rate = v["loader_rate"]
    print(
        f"  loader with {v['workers']} worker(s): folder {f_rate:,.0f} samples/s, "
        f"packed {p_rate:,.0f} samples/s (x{p_rate / f_rate:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
