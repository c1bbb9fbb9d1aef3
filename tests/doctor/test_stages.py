"""The doctor's stages one by one: each fills its part of Findings; the report's schema;
the sample of a source; the Loader contract the doctor reads."""

from __future__ import annotations

import json

import pytest
from doctor_bottlenecks import FIXED16, make_folder

from stoker.doctor.findings import Findings, Settings
from stoker.doctor.measure.loader import PREFETCH, estimated_slots
from stoker.doctor.measure.source import sample_source
from stoker.doctor.measure.storage import measure_read_records
from stoker.doctor.report import SCHEMA, SECTIONS, Report, report_data
from stoker.doctor.stages import (
    alternatives,
    augment,
    cost,
    decode,
    device,
    loader,
    storage,
    system,
    verdict,
)

PARTS = [
    ("storage", storage.run),
    ("decode", decode.run),
    ("augment", augment.run),
    ("alternatives", alternatives.run),
    ("cost", cost.run),
    ("loader", lambda f: loader.run(f, lambda _: None)),
    ("h2d", device.run_h2d),
    ("model", device.run_model),
    ("checks", system.run),
    ("judgement", verdict.run),
]


def _settings(path: str, *, run_loader: bool = False, transforms=FIXED16) -> Settings:
    return Settings(
        path=path,
        transforms=transforms,
        transforms_label="FIXED16",
        batch_size=8,
        step_time_ms=5.0,
        model=None,
        workers_max=1,
        workers=[1],
        cores=2,
        seconds=0.1,
        sample_size=12,
        cache="auto",
        run_loader=run_loader,
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("stages") / "imgs", n=20, size=16)


def test_each_stage_fills_its_part_in_order(folder):
    f = Findings(_settings(folder), sample_source(folder, n=12))
    try:
        for i, (part, run) in enumerate(PARTS):
            assert not hasattr(f, part), part  # unset until its stage runs
            run(f)
            assert hasattr(f, part), part
            for later, _ in PARTS[i + 1 :]:
                assert not hasattr(f, later), (part, later)
    finally:
        f.sample.close()
    assert len(f.storage.payloads) == 12 and f.storage.packed is not None
    assert f.decode.main is not None and len(f.decode.images) == 12
    assert f.augment.out_shape == (16, 16, 3) and f.augment.target is None
    assert f.alternatives.scaled is None and f.alternatives.resized is None
    assert f.cost.total_s > 0
    assert f.loader.runs == [] and set(f.loader.predicted) == {1, 2}
    assert f.model is not None and f.model["source"] == "--step-time"
    assert [c.name for c in f.checks][0] == "memory"
    assert f.judgement.verdict.bound == "model" and f.judgement.workers == 1
    skipped = [x["stage"] for x in f.not_measured]
    assert "loader" in skipped


def test_report_schema_round_trip(folder):
    f = Findings(_settings(folder), sample_source(folder, n=12))
    try:
        for _, run in PARTS:
            run(f)
    finally:
        f.sample.close()
    data = report_data(f, elapsed_s=1.5)
    assert tuple(data) == SECTIONS and data["schema"] == SCHEMA
    r = Report(data)
    again = Report.from_json(r.to_json())
    assert again.to_dict() == r.to_dict() and tuple(again.to_dict()) == SECTIONS
    assert again.render() == r.render()
    assert data["source"]["sampled"] == 12 and data["settings"]["workers"] == [1]
    with pytest.raises(ValueError, match="schema"):
        Report.from_json(json.dumps({"schema": "other/1"}))


def test_ring_estimate_is_the_loaders_rule(folder):
    from stoker.loader import Loader

    assert estimated_slots() == PREFETCH + 2
    with Loader(folder, batch_size=4, transforms=FIXED16, workers=0, prefetch=PREFETCH) as ld:
        assert ld.slots == estimated_slots()
        assert ld.start_method is None  # no worker processes


def test_sample_of_a_folder_and_of_sharded_records(tmp_path):
    from stoker._core.errors import StokerFormatError
    from stoker.pack import pack

    src = make_folder(tmp_path / "imgs", n=30, size=16)
    s = sample_source(src, n=8)
    assert s.kind == "folder" and s.count == 30 and len(s.files) == 8
    (tmp_path / "empty" / "a").mkdir(parents=True)
    with pytest.raises(StokerFormatError, match="no image files found"):
        sample_source(str(tmp_path / "empty"), n=4)
    pack(src, tmp_path / "train", workers=1, progress=False, shard_size=10)
    manifest = next(tmp_path.glob("train*.stoker.json"))
    s = sample_source(str(manifest), n=12)
    try:
        assert s.kind == "records" and s.count == 30 and s.total_bytes > 0
        cold, payloads = measure_read_records(s, seconds=0.1, cold=True)
        assert cold.name == "read records (cold)" and cold.samples == 12
        assert len(payloads) == 12 and all(p[:3] == b"\xff\xd8\xff" for p in payloads)
    finally:
        s.close()


def test_the_checks_name_the_engine_the_loader_ran_on(folder):
    f = Findings(_settings(folder, run_loader=True), sample_source(folder, n=12))
    try:
        for _, run in PARTS:
            run(f)
    finally:
        f.sample.close()
    assert [r.engine for r in f.loader.runs] == ["linux"]
    check = next(c for c in f.checks if c.name == "start_method")
    assert check.data["engine"] == "linux"
    assert "forkserver (the loader's own, engine 'linux')" in check.message
