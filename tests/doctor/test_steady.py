"""The doctor holds still: runs on one set agree on the bound or say they cannot decide, a
change the report says cannot help is never ranked first, warm reads are warm, and the run
keeps to its budget and says whether its intervals came out tight."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from doctor_bottlenecks import FIXED16, make_folder

from stoker.cli import main
from stoker.doctor import diagnose
from stoker.doctor.measure.timing import spread_of, time_loop


def _consistent(verdicts: list[dict]) -> None:
    """Decided verdicts name one bound; an undecided one has it as its bound or runner-up."""
    decided = {v["bound"] for v in verdicts if v["decided"]}
    assert len(decided) <= 1, verdicts
    for v in verdicts:
        assert v["runner_up"] is not None and v["runner_up"] != v["bound"]
        if not v["decided"] and decided:
            assert decided & {v["bound"], v["runner_up"]}, verdicts


def _never_first_what_cannot_help(report: dict) -> None:
    recs, v = report["recommendations"], report["verdict"]
    if v["cpu_capped"] and recs:
        assert not recs[0]["action"].startswith("use more workers"), (v["text"], recs[0])


def _runs(src, n: int, **kw) -> list[dict]:
    out = []
    for _ in range(n):
        r = diagnose(src, transforms=FIXED16, batch_size=16, progress=False, **kw)
        out.append(json.loads(r.to_json()))
    return out


def test_three_runs_agree_or_say_they_cannot_decide(tmp_path):
    src = make_folder(tmp_path / "imgs", n=120, size=48)
    reports = _runs(src, 3, seconds=0.3, sample_size=64, workers_max=1)
    _consistent([r["verdict"] for r in reports])
    for r in reports:
        _never_first_what_cannot_help(r)
        assert r["budget"]["ended"] in ("tight", "budget")
        assert (r["budget"]["ended"] == "tight") == (not r["budget"]["loose"])
        stages = {s["name"]: s for s in r["stages"]}
        for s in stages.values():
            lo, hi = s["interval_ms"]
            assert lo <= s["per_sample_ms"] <= hi, s


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_runs_under_a_cpu_hog_and_three_quiet_agree_and_keep_time(tmp_path):
    src = make_folder(tmp_path / "imgs", n=1000, size=112)
    hog = "import time\nend = time.time() + 120\nwhile time.time() < end: pass\n"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2)]
    try:
        busy = _runs(src, 3, seconds=20, workers_max=2)
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    reports = busy + _runs(src, 3, seconds=20, workers_max=2)
    _consistent([r["verdict"] for r in reports])
    for r in reports:
        _never_first_what_cannot_help(r)
        b = r["budget"]
        assert b["spent_s"] <= 1.1 * 20 and r["elapsed_s"] <= 1.1 * 20 + b["startup_s"], b


def test_undecided_verdict_is_said_in_words_and_json(tmp_path, capsys):
    src = make_folder(tmp_path / "imgs", n=48, size=32)
    argv = ["doctor", src, "--transforms", "doctor_bottlenecks:FIXED16", "--batch-size", "8"]
    assert main([*argv, "--seconds", "0.2", "--no-loader", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    v = d["verdict"]
    assert set(v["intervals_ms"]) == {"storage", "decode", "augment", "loader"}
    lo, hi = v["intervals_ms"][v["bound"]]
    assert lo <= hi
    if not v["decided"]:
        assert "Undecided:" in v["text"]
    else:
        assert "Undecided:" not in v["text"]
        assert lo > v["intervals_ms"][v["runner_up"]][1]
    assert "Shares of" in v["text"]  # what the shares are a share of


def test_the_budget_bounds_the_run_and_is_reported(tmp_path, capsys):
    src = make_folder(tmp_path / "imgs", n=48, size=32)
    argv = ["doctor", src, "--transforms", "doctor_bottlenecks:FIXED16", "--batch-size", "8"]
    t0 = time.perf_counter()
    assert main([*argv, "--seconds", "2", "--workers-max", "1"]) == 0
    took = time.perf_counter() - t0
    out = capsys.readouterr().out
    assert "a budget of 2.0 s" in " ".join(out.split())  # the report wraps its lines
    line = next(x for x in out.splitlines() if x.startswith("Budget 2 s"))
    assert "came out tight" in line or "the budget ran out" in line
    spent, startup = (float(x) for x in re.findall(r"([0-9.]+) s", line)[1:3])
    assert spent <= 1.1 * 2 and took < spent + startup + 1, line  # a hard cap after start-up


def test_warm_reads_are_no_slower_than_cold_ones(tmp_path):
    src = make_folder(tmp_path / "imgs", n=200, size=32)
    r = diagnose(src, transforms=FIXED16, batch_size=8, seconds=0.5, loader=False, progress=False)
    stages = {s["name"]: s for s in r.stages}
    warm, cold = stages["read files (warm)"], stages["read files (cold)"]
    # the warm pass reads every file once untimed first: its interval cannot lie above cold's
    assert warm["interval_ms"][0] <= cold["interval_ms"][1], (warm, cold)


def test_a_measurement_goes_on_until_its_interval_is_tight():
    rng = iter(range(1 << 30))

    def work(_):
        next(rng)
        time.sleep(0.0025)

    calls, wall, _, _, spread = time_loop(work, [0], seconds=0.05, max_seconds=5.0)
    assert spread is not None and spread.tight and spread.rounds >= 6
    assert 0.05 <= wall < 5.0
    assert spread.lo_s <= spread.mid_s <= spread.hi_s


def test_the_interval_of_a_few_rounds_is_their_range():
    s = spread_of([3.0, 1.0, 2.0])
    assert (s.lo_s, s.mid_s, s.hi_s, s.tight) == (1.0, 2.0, 3.0, False)
    wide = spread_of([1.0] * 10 + [2.0] * 10)
    assert not wide.tight and wide.lo_s == 1.0 and wide.hi_s == 2.0
    narrow = spread_of([1.0 + 0.001 * i for i in range(40)])
    assert narrow.tight


def test_more_workers_are_not_offered_when_the_cores_are_the_cap():
    from stoker.doctor.stages.verdict import more_workers

    rising = {1: 1000.0, 2: 1900.0}
    assert more_workers(rising, 2, capped=False) == 4
    assert more_workers(rising, 2, capped=True) is None
    assert more_workers({1: 1000.0, 2: 1010.0}, 2, capped=False) is None  # the curve is flat
