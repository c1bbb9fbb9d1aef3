"""On a CUDA machine: the copy to the device and a model timed on it (skipped elsewhere)."""

from __future__ import annotations

import pytest
from doctor_bottlenecks import FIXED16, make_folder

from stoker.doctor import diagnose


@pytest.mark.gpu
def test_h2d_and_model_on_the_device(tmp_path):
    src = make_folder(tmp_path / "imgs", n=32, size=16)
    r = diagnose(
        src,
        transforms=FIXED16,
        batch_size=8,
        model="doctor_bottlenecks:make_sleepy_model",
        seconds=0.3,
        loader=False,
        progress=False,
    )
    h2d = r.data["h2d"]
    assert h2d is not None and h2d["rate"] > 0 and h2d["gb_per_s"] > 0, r.not_measured
    assert "cuda" in r.data["model"]["source"]
    assert r.bound == "model"
    assert r.data["verdict"]["h2d_rate"] == h2d["rate"]
