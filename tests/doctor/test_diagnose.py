"""diagnose / stoker doctor on pipelines with a known bottleneck, on real files."""

from __future__ import annotations

import json

import pytest
from doctor_bottlenecks import FIXED8, FIXED16, SleepyCrop, make_folder

from stoker.doctor import Report, diagnose
from stoker.doctor.report import SECTIONS


def test_sleeping_transform_is_named_and_the_prediction_holds(tmp_path):
    src = make_folder(tmp_path / "imgs", n=96, size=24)
    r = diagnose(
        src,
        transforms=SleepyCrop(4.0, 16),
        batch_size=8,
        step_time_ms=2.0,  # a fast model: the input bounds the run
        workers_max=2,
        seconds=2.0,
        sample_size=48,
        progress=False,
    )
    assert r.bound == "augment", r.render()
    assert r.data["pipeline"]["augment_ms"] == pytest.approx(4.0, rel=0.5)
    assert r.gpu_busy_share is not None and r.gpu_busy_share < 0.5
    measured, predicted = r.loader_measured, r.loader_predicted
    assert set(measured) == {1, 2}, r.not_measured
    # the model's prediction for 2 workers, from in-process timings and the 1-worker run
    assert predicted[2] == pytest.approx(measured[2], rel=0.25), r.render()
    assert measured[2] > 1.4 * measured[1]  # sleeping workers scale
    # sleeping (not computing) workers: more workers, or a cheaper augmentation, come first
    top = {rec["action"].split(" (")[0]: rec for rec in r.recommendations[:2]}
    assert set(top) == {"use more workers", "cheapen the augmentation"}, r.render()
    more = top["use more workers"]
    assert more["loader_after"] == pytest.approx(2 * more["loader_before"], rel=0.2)


def test_many_tiny_files_name_storage_and_packing_first(tmp_path):
    src = make_folder(tmp_path / "tiny", n=300, size=8)
    r = diagnose(
        src,
        transforms=FIXED8,
        batch_size=32,
        seconds=0.3,
        cache="cold",
        loader=False,
        progress=False,
    )
    stages = {s["name"]: s for s in r.stages}
    cold_files, cold_packed = stages["read files (cold)"], stages["read packed (cold)"]
    assert cold_files["rate"] < cold_packed["rate"]
    assert r.bound == "storage", r.render()
    top = r.recommendations[0]
    assert top["action"].startswith("pack the folder"), r.render()
    assert top["basis"] == "measured" and top["loader_gain"] > 1.5


def test_sleeping_model_is_named(tmp_path):
    src = make_folder(tmp_path / "imgs", n=48, size=16)
    r = diagnose(
        src,
        transforms=FIXED16,
        batch_size=8,
        model="doctor_bottlenecks:make_sleepy_model",
        seconds=0.4,
        sample_size=32,
        loader=False,
        progress=False,
    )
    assert r.bound == "model", r.render()
    model = r.data["model"]
    assert model["step_ms"] == pytest.approx(40.0, rel=0.5)
    assert model["rate"] == pytest.approx(8 / 0.04, rel=0.5)
    assert r.gpu_busy_share == 1.0
    assert all(rec["gain"] == pytest.approx(1.0) for rec in r.recommendations)
    assert "Speeding up the input will not help" in r.data["verdict"]["text"]


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    src = make_folder(tmp_path_factory.mktemp("quick") / "imgs", n=40, size=32)
    return diagnose(
        src,
        transforms="seed000",
        batch_size=8,
        step_time_ms=10,
        seconds=0.15,
        sample_size=24,
        loader=False,
        progress=False,
    )


def test_json_schema(quick_report):
    d = json.loads(quick_report.to_json())  # strict JSON: no NaN or Infinity
    assert d["schema"] == "stoker.doctor/2"
    assert list(d) == list(SECTIONS)
    for key in (
        "source",
        "settings",
        "corrupt",
        "system",
        "stages",
        "pipeline",
        "loader",
        "h2d",
        "model",
        "verdict",
        "recommendations",
        "not_measured",
        "elapsed_s",
        "stoker_version",
    ):
        assert key in d, key
    assert d["source"]["kind"] == "folder" and d["source"]["count"] == 40
    assert d["source"]["output_shape"] == [128, 128, 3] and d["source"]["output_dtype"] == "float32"
    assert {c["name"] for c in d["system"]} == {
        "memory",
        "ulimit",
        "cores",
        "threads",
        "start_method",
        "load",
        "node",
    }
    assert all(c["status"] in ("ok", "warn", "fail") for c in d["system"])
    kinds = {s["stage"] for s in d["stages"]}
    assert {"storage", "decode", "augment"} <= kinds
    for s in d["stages"]:
        assert s["rate"] > 0 and s["samples"] > 0 and isinstance(s["name"], str)
    assert {p["workers"] for p in d["loader"]["predicted"]} >= set(d["settings"]["workers"])
    v = d["verdict"]
    assert v["bound"] in ("storage", "decode", "augment", "loader", "host-to-device", "model")
    assert 0 <= v["gpu_busy_share"] <= 1 and v["text"]
    for rec in d["recommendations"]:
        assert rec["basis"] in ("measured", "estimated")
        assert rec["gain"] > 0 and rec["loader_after"] > 0 and rec["action"] and rec["detail"]
    gains = [(r["gain"], r["loader_gain"]) for r in d["recommendations"]]
    assert gains == sorted(gains, reverse=True)  # best first
    assert Report.from_json(quick_report.to_json()).to_dict() == d
    # the seed-000 chain ends in Normalize: the uint8 + GPU normalisation change is offered
    assert any("uint8" in r["action"] for r in d["recommendations"])
    assert any(s["stage"] == "host-to-device" for s in d["not_measured"]) or d["h2d"]


def test_plot_writes_a_png(quick_report, tmp_path):
    out = tmp_path / "doctor.png"
    quick_report.plot(out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert not (tmp_path / "doctor.png.partial").exists()


def test_render_is_readable(quick_report):
    text = quick_report.render()
    for part in (
        "Stages, one process each",
        "Verdict:",
        "Changes, best first",
        "System",
        "per sample",
    ):
        assert part in text, part


def test_bad_arguments(tmp_path):
    src = make_folder(tmp_path / "imgs", n=4, size=8)
    with pytest.raises(ValueError, match="batch_size"):
        diagnose(src, batch_size=0)
    with pytest.raises(ValueError, match="step_time_ms or model"):
        diagnose(src, step_time_ms=5, model="x:y")
    with pytest.raises(ValueError, match="cache"):
        diagnose(src, cache="lukewarm")
    with pytest.raises(ValueError, match="unknown transform preset"):
        diagnose(src, transforms="no-such-preset")
    with pytest.raises(ValueError, match="cannot import"):
        diagnose(src, transforms="no_such_module_here:thing")
    with pytest.raises(FileNotFoundError):
        diagnose(tmp_path / "missing")
    from stoker._core.errors import StokerFormatError

    (tmp_path / "empty").mkdir()
    with pytest.raises(StokerFormatError, match="no image files"):
        diagnose(tmp_path / "empty")
