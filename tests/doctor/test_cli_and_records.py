"""`stoker doctor` on the command line, and on packed RecordIO input."""

from __future__ import annotations

import json

import pytest
from doctor_bottlenecks import make_folder

from stoker.cli import main
from stoker.doctor import diagnose


def test_cli_json_and_plot(tmp_path, capsys):
    src = make_folder(tmp_path / "imgs", n=24, size=16)
    png = tmp_path / "out.png"
    rc = main(
        [
            "doctor",
            src,
            "--transforms",
            "doctor_bottlenecks:FIXED16",
            "--batch-size",
            "8",
            "--step-time",
            "5",
            "--no-loader",
            "--seconds",
            "0.1",
            "--sample-size",
            "16",
            "--json",
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == "stoker.doctor/2"
    assert d["model"]["source"] == "--step-time" and d["model"]["rate"] == 8 / 0.005
    assert d["settings"]["transforms"] == "doctor_bottlenecks:FIXED16"
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_text_report(tmp_path, capsys):
    src = make_folder(tmp_path / "imgs", n=16, size=16)
    rc = main(
        [
            "doctor",
            src,
            "--transforms",
            "doctor_bottlenecks:FIXED16",
            "--no-loader",
            "--seconds",
            "0.1",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert out.startswith(f"stoker doctor: {src} (folder, 16 images")
    # a verdict, or (a 0.1 s budget on a busy machine) the two largest parts overlapping
    assert "Verdict:" in out or "Undecided:" in out
    words = " ".join(out.split())  # the report wraps its text where the figures' widths say
    assert "Give --step-time or --model" in words


def test_cli_bad_arguments_are_one_line(tmp_path, capsys):
    src = make_folder(tmp_path / "imgs", n=4, size=8)
    assert main(["doctor", src, "--transforms", "no-such-preset", "--no-loader"]) == 2
    err = capsys.readouterr().err
    assert "unknown transform preset 'no-such-preset'" in err and "Traceback" not in err
    assert main(["doctor", str(tmp_path / "missing"), "--no-loader"]) == 2  # as every command
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["doctor", src, "--plot", str(tmp_path / "x.jpg"), "--no-loader"]) == 2


def test_records_source(tmp_path):
    from stoker.pack import pack

    src = make_folder(tmp_path / "imgs", n=40, size=16)
    pack(src, tmp_path / "train", workers=1, progress=False)
    r = diagnose(
        tmp_path / "train.rec",
        transforms="doctor_bottlenecks:FIXED16",
        batch_size=8,
        workers_max=1,
        seconds=1.0,
        sample_size=32,
        step_time_ms=1.0,
        progress=False,
    )
    assert r.data["source"]["kind"] == "records" and r.data["source"]["count"] == 40
    names = {s["name"] for s in r.stages}
    assert {"read records (cold)", "read records (warm)"} <= names
    assert "read files (warm)" not in names  # nothing to pack: no "pack the folder" change
    assert not any(rec["action"].startswith("pack the folder") for rec in r.recommendations)
    assert r.loader_measured.get(1, 0) > 0, r.not_measured


@pytest.mark.parametrize("width", range(20, 90))
def test_the_report_never_splits_an_option_across_lines(width):
    # a user copies "--step-time" from the report: a wrap at its hyphen would print "--step-"
    # and "time" on two lines (it did, for some widths the figures gave)
    from stoker.doctor.report import _Lines

    lines = _Lines(width)
    lines.wrap("x " * 30 + "Give --step-time or --model to compare, or --seconds 10.")
    words = "\n".join(lines).split()
    assert {"--step-time", "--model", "--seconds"} <= set(words)


def test_a_mixture_reports_each_sets_share_and_rate(tmp_path, capsys):
    """``--mix-with B --weights 0.75,0.25``: the loader runs read the mixture, and the report
    gives each set's share of the samples and rate (a RecordIO and a TFRecord set)."""
    from stoker.doctor import Report
    from stoker.pack import pack

    for name, fmt in (("a", "recordio"), ("b", "tfrecord")):
        folder = make_folder(tmp_path / f"i{name}", n=40, size=16)
        pack(folder, tmp_path / name / "train", format=fmt, workers=1, progress=False)
    a, b = (str(tmp_path / n / "train.stoker.json") for n in "ab")
    assert main(["doctor", a, "--mix-with", b, "--no-loader"]) == 2  # no --weights
    assert "needs both --mix-with SET and --weights" in capsys.readouterr().err
    argv = ["doctor", a, "--mix-with", b, "--weights", "0.75,0.25", "--workers-max", "1"]
    argv += ["--transforms", "doctor_bottlenecks:FIXED16", "--batch-size", "8", "--json"]
    assert main([*argv, "--seconds", "1", "--sample-size", "16", "--step-time", "1"]) == 0
    d = json.loads(capsys.readouterr().out)
    run = d["loader"]["measured"][0]
    assert len(run["per_set"]) == 2 and sum(run["per_set"]) == run["samples"] > 0
    assert run["per_set"][0] > run["per_set"][1] > 0  # 40 of A to 13 of B an epoch
    words = " ".join(Report(d).render().split())
    assert "Per set at 1 workers (share, samples/s): set 0 " in words and "; set 1 " in words
