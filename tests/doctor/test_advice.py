"""Advice that keeps the training data: on 500x375 JPEGs, a Resize + CenterCrop chain gets
pack-time resizing as a change that keeps what the model sees, while RandomResizedCrop(224)
gets no pack size under 224 / sqrt(0.08) px unless it is called a trade; the headline says
undecided when the verdict is."""

from __future__ import annotations

import os

import pytest
from doctor_bottlenecks import FIXED16, make_folder

from stoker.codecs import REGION
from stoker.doctor import changes as C
from stoker.doctor import diagnose
from stoker.doctor import verdict as V
from stoker.doctor.stages.alternatives import pack_size
from stoker.doctor.verdict import headline
from stoker.transforms import CenterCrop, Compose, HorizontalFlip, RandomResizedCrop, Resize

CROP = Compose([RandomResizedCrop(224), HorizontalFlip()])
CENTRE = Compose([Resize(128), CenterCrop(112)])
COST = V.Cost(1e-3, 1e-4, 2e-3, 2e-3, 3e-3, 3e-3)  # read, decode, augment: wall and CPU s


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    """24 JPEGs of 500x375."""
    return make_folder(tmp_path_factory.mktemp("photos"), n=24, size=(375, 500))


def _advice(photos: str, transforms) -> list[dict]:
    """The changes ranked, and those left unranked (their gain within the noise)."""
    r = diagnose(photos, transforms=transforms, batch_size=16, seconds=1.0, loader=False,
                 progress=False)  # fmt: skip
    return r.recommendations


def test_resize_and_centre_crop_get_pack_time_resizing_as_a_free_change(photos):
    recs = _advice(photos, CENTRE)
    (resize,) = [r for r in recs if r.get("action", "").startswith("resize at pack time")]
    assert resize["changes_data"] is False and resize["gain_lo"] > 1.0
    assert "375x500 -> about 128x128 px" in resize["detail"]  # what Resize(128) needs
    assert pack_size(CENTRE, (375, 500), (112, 112)) == ((128, 128), "")


def test_random_resized_crop_gets_no_pack_size_under_792_px_unless_called_a_trade(photos):
    size, why = pack_size(CROP, (375, 500), (224, 224))
    assert size == (224, 224) and "at least 792 px" in why  # 224 / sqrt(0.08), rounded up
    # large enough photos pack at that size, and that is no trade
    assert min(pack_size(CROP, (1500, 2000), (224, 224))[0]) == 792
    assert pack_size(CROP, (1500, 2000), (224, 224))[1] == ""
    # the trade diagnose finds is what a smaller payload's change carries
    recs = C.recommend(
        COST, workers=2, cores=1, efficiency=1.0, loader_rate=100.0, h2d_rate=None,
        model_rate=1000.0, resized=(1e-4, 1e-4, 1e-4, 1e-4, "224x224", 1.1e-4), trade=why,
    )  # fmt: skip
    (resize,) = [r for r in recs if r.action.startswith("resize at pack time")]
    assert resize.changes_data and "at least 792 px" in resize.detail
    smaller = ("resize at pack time", "decode at reduced size")
    r = diagnose(photos, transforms=CROP, batch_size=16, seconds=1.0, loader=False,
                 progress=False)  # fmt: skip
    offered = [x for x in r.recommendations if x["action"].startswith(smaller)]
    noisy = [
        x for x in r.not_measured if x["stage"].startswith(tuple(f"change: {a}" for a in smaller))
    ]
    assert offered or noisy  # measured; ranked, or on a loaded machine within the noise
    for x in offered:  # offered as a trade that says which size keeps every crop whole
        assert x["changes_data"] is True and "at least 792 px" in x["detail"], x


def test_the_headline_says_undecided_when_the_verdict_is():
    assert headline({"bound": "augment", "decided": True}) == "augment bounds the run"
    v = {"bound": "augment", "runner_up": "decode", "decided": False}
    assert headline(v) == "undecided: augment or decode bounds the run"
    assert "augment bounds" not in headline(v).split(":")[0]


def test_a_small_budget_is_kept(tmp_path):
    src = make_folder(tmp_path / "imgs", n=64, size=16)
    r = diagnose(src, transforms=FIXED16, batch_size=8, workers_max=2, seconds=1.5,
                 progress=False)  # fmt: skip
    b = r.data["budget"]
    assert b["spent_s"] <= 1.1 * 1.5, b
    assert r.data["elapsed_s"] == pytest.approx(b["spent_s"] + b["startup_s"])
    for cut in b["cut"]:
        assert any(x["stage"] == cut and "budget ran out" in x["reason"] for x in r.not_measured)
    assert os.path.isdir(src)


@pytest.mark.skipif(REGION is None, reason="the region decoder is not built")
def test_region_decode_is_timed_where_a_random_resized_crop_leads_and_offered_as_no_trade(photos):
    """The crop's box alone is timed for CROP (its region decoder applies) and not for CENTRE;
    offered, it keeps what the model sees (the same pixels) and says the measured figures."""
    runs = {}
    for name, chain in (("crop", CROP), ("centre", CENTRE)):
        runs[name] = diagnose(photos, transforms=chain, batch_size=16, seconds=1.0, loader=False,
                              progress=False)  # fmt: skip
    timed = {n: {s["name"] for s in r.stages} for n, r in runs.items()}
    assert "decode the crop's box only" in timed["crop"]
    assert "decode the crop's box only" not in timed["centre"]
    recs = C.recommend(
        COST, workers=2, cores=1, efficiency=1.0, loader_rate=100.0, h2d_rate=None,
        model_rate=1000.0, decode_scaled=(1e-3, 1e-3, "decode the crop's box only", 1.1e-3),
        trade="crops upsampled",
    )  # fmt: skip
    (region,) = [r for r in recs if r.action.startswith("decode only the crop's box")]
    assert not region.changes_data and "2.000 -> 1.000 ms/sample" in region.detail
