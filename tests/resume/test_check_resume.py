"""check-resume on real loaders: child processes, real SIGKILLs, real JPEG decode. It passes on
loaders with random augmentation (one world size, 4 -> 3 ranks, RecordIO and TFRecord) and
fails, naming the first differing sample, on loaders that are not resumable."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

import pytest
from resume_helpers import (
    CountingFlip,
    GlobalRandomFlip,
    augment,
    every_rank_rank_0,
    forgetful,
    one_rank,
)

from stoker import CheckResumeError
from stoker._core.errors import ChildTraceback
from stoker.cli import main
from stoker.resume import LoaderSpec, ResumeReport, check_resume
from stoker.transforms import Compose


def test_random_augmentation_resumes_exactly_on_one_rank_with_a_worker(sets):
    spec = LoaderSpec(
        sets["recordio"], batch_size=8, transforms=augment(), shuffle=True, seed=3, workers=1
    )
    r = check_resume(spec, kills=2, world_size=1, epochs=2)
    assert r.passed, str(r)
    assert len(r.kills) == 2 and r.samples == 2 * 48  # both epochs, every sample once
    assert all(x["resumed_from"] is not None and x["world_size"] == 1 for x in r.resumes)
    assert r.verdict().startswith("PASS: resume is exact")


def test_tfrecord_resumes_exactly_from_4_to_3_ranks(sets):
    spec = LoaderSpec(
        sets["tfrecord"], batch_size=4, transforms=augment(), shuffle=True, seed=3, workers=0
    )
    r = check_resume(spec, kills=2, world_size=4, resume_on=3, epochs=2, seed=1)
    assert r.passed, str(r)
    assert [x["world_size"] for x in r.resumes] == [3, 3]
    assert r.resumes[0]["resumed_from"] is not None  # the 4-rank state resumed on 3 ranks
    assert r.samples >= 2 * 48


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["recordio", "tfrecord", "wds"])
@pytest.mark.parametrize(
    "shuffle, drop_last, world_size, resume_on",
    [(False, False, 3, 2), (True, True, 2, 3), ("shards", False, 4, 3), ("shards", True, 3, 3)],
)
def test_every_format_and_order_resumes_exactly(
    sets, fmt, shuffle, drop_last, world_size, resume_on
):
    spec = LoaderSpec(
        sets[fmt],
        batch_size=2,
        transforms=augment(),
        shuffle=shuffle,
        seed=11,
        drop_last=drop_last,
        workers=1,
    )
    r = check_resume(spec, kills=3, world_size=world_size, resume_on=resume_on, seed=5)
    assert r.passed, str(r)
    assert len(r.kills) == 3


def _check_with(path: str, last_step: object) -> ResumeReport:
    """One kill of a 1-epoch run whose augmentation ends in ``last_step``."""
    tf = Compose([augment(), last_step])
    spec = LoaderSpec(path, batch_size=8, transforms=tf, shuffle=True, seed=3, workers=0)
    r = check_resume(spec, kills=1, epochs=1)
    assert not r.passed and r.difference is not None
    assert r.difference.why == "pixels"
    return r


def test_a_bounded_check_stops_every_run_at_its_step(sets):
    spec = LoaderSpec(
        sets["tfrecord"], batch_size=4, transforms=augment(), shuffle=True, seed=3, workers=0
    )
    r = check_resume(spec, kills=2, world_size=2, resume_on=1, epochs=2, steps=8, seed=2)
    assert r.passed, str(r)
    assert r.steps == 8 and all(k < 8 for k in r.kills)
    assert r.samples < 2 * 48  # the first 8 steps, not the 2 epochs


def test_numpys_global_rng_in_a_transform_fails_naming_the_sample(sets):
    r = _check_with(sets["recordio"], GlobalRandomFlip())
    d = r.difference
    assert d is not None and d.got_index == d.expected_index and d.got_key == d.expected_key
    assert f"the same sample with other pixels: index {d.got_index}" in r.verdict()


def test_a_transform_that_counts_calls_fails_at_the_first_sample_after_the_resume(sets):
    r = _check_with(sets["recordio"], CountingFlip())
    d = r.difference
    step = r.resumes[0]["resumed_from"]
    assert d is not None and d.row == 0
    assert step is not None and d.resumed_from == step and d.batch == step
    assert f"after the resume from the state of step {step}" in r.verdict()


def test_a_loader_that_ignores_its_state_fails_with_another_sample(sets):
    r = check_resume(functools.partial(forgetful, sets["recordio"]), kills=1, epochs=1)
    assert not r.passed
    d = r.difference
    assert d is not None and d.why == "index" and d.expected_index != d.got_index
    assert d.batch == r.resumes[0]["resumed_from"] and d.row == 0


def test_cli_json_verdict(sets, capsys):
    code = main(
        [
            "check-resume",
            sets["recordio"],
            "--batch-size",
            "8",
            "--transforms",
            "resume_helpers:augment",
            "--workers",
            "0",
            "--kills",
            "1",
            "--epochs",
            "1",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["passed"] is True and out["difference"] is None
    assert len(out["kills"]) == 1 and out["samples"] == 48


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "give either SOURCE"),
        (["x.rec", "--factory", "resume_helpers:forgetful"], "give either SOURCE"),
        (["x.rec", "--transforms", "no_such_module:thing"], "cannot import"),
    ],
)
def test_cli_refuses_bad_arguments(argv, message, capsys):
    assert main(["check-resume", *argv]) == 2
    assert message in capsys.readouterr().err


def test_doctor_check_resume_reports_a_resume_that_is_not_exact(sets, capsys):
    code = main(
        [
            "doctor",
            sets["recordio"],
            "--batch-size",
            "8",
            "--transforms",
            "resume_helpers:counting",
            "--no-loader",
            "--sample-size",
            "16",
            "--seconds",
            "0.1",
            "--check-resume",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 1
    assert out["schema"] == "stoker.doctor/2"  # the doctor's report, with the check beside it
    assert out["check_resume"]["passed"] is False
    assert out["check_resume"]["difference"]["why"] == "pixels"


def test_a_factory_that_ignores_the_rank_is_refused_saying_so(sets):
    with pytest.raises(CheckResumeError, match="must pass rank= and world_size="):
        check_resume(functools.partial(every_rank_rank_0, sets["recordio"]), world_size=2)


def test_a_loader_that_cannot_start_is_an_error_naming_it(tmp_path):
    missing = str(tmp_path / "nowhere.rec")
    with pytest.raises(CheckResumeError, match="nowhere.rec") as e:
        check_resume(LoaderSpec(missing, batch_size=4, workers=0), kills=1)
    assert "failed in its child process: FileNotFoundError" in str(e.value)
    assert "\n" not in str(e.value)  # the child's traceback is the cause, behind it
    assert isinstance(e.value.__cause__, ChildTraceback) and "Traceback" in str(e.value.__cause__)


def test_a_factory_without_rank_arguments_runs_one_rank_or_is_refused_at_the_call(sets):
    factory = functools.partial(one_rank, sets["recordio"])
    r = check_resume(factory, kills=1, epochs=1)
    assert r.passed, str(r)
    with pytest.raises(TypeError, match=r"make_loader\(\) must take make_loader\(rank=, world_s"):
        check_resume(factory, world_size=2)


def _cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "check-resume", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out, time.monotonic() - t0


def test_cli_on_a_bad_manifest_or_batch_size_is_one_line(tmp_path):
    bad = tmp_path / "bad.stoker.json"
    bad.write_text('{"format": "recordio", "shards": [')
    out, _ = _cli(str(bad), "--kills", "1")
    assert out.returncode == 1 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("stoker check-resume: error: the run ref1 on 1 rank(s) failed")
    assert f"ManifestError: {bad}: not a JSON manifest" in line and len(line) < 300
    out, _ = _cli(str(bad), "--kills", "1", "--verbose")  # the child's traceback first
    assert out.returncode == 1 and "Traceback" in out.stderr
    assert out.stderr.splitlines()[-1] == line
    out, took = _cli(str(bad), "--batch-size", "0")
    assert out.returncode == 2 and took < 2.0
    assert out.stderr == "stoker check-resume: error: --batch-size must be >= 1, got 0\n"


SCRIPT = """
import sys
import numpy as np
from stoker.resume import LoaderSpec, check_resume
from stoker.transforms.base import Transform


class Brighter(Transform):  # defined in the script: the children must import it from there
    def __call__(self, img, rng):
        return np.minimum(img.astype(np.int16) + int(rng.integers(0, 40)), 255).astype(np.uint8)

    def output_spec(self, in_spec):
        return in_spec


if __name__ == "__main__":
    spec = LoaderSpec(sys.argv[1], batch_size=8, transforms=Brighter(), shuffle=True, workers=1)
    print(check_resume(spec, kills=1, epochs=1).verdict())
"""


def test_transforms_defined_in_the_users_script_reach_the_workers_of_every_child(sets, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, str(script), sets["recordio"]],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("PASS: resume is exact"), out.stdout
