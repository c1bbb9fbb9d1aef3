"""The throughput model, the verdict and the system checks, without processes."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from stoker._core.system import cpu_quota, usable_cores
from stoker.doctor import changes as C
from stoker.doctor import system as S
from stoker.doctor import verdict as V
from stoker.doctor.stages.loader import worker_counts
from stoker.doctor.stages.verdict import still_rising

# 1 ms read (0.1 ms CPU: the rest waits on storage), 2 ms decode, 3 ms augment (all CPU)
COST = V.Cost(1e-3, 1e-4, 2e-3, 2e-3, 3e-3, 3e-3)


def test_predict_is_the_documented_formula():
    assert COST.total_s == pytest.approx(6e-3) and COST.cpu_s == pytest.approx(5.1e-3)
    b, c = COST.blocked_s, COST.cpu_s
    assert b == pytest.approx(0.9e-3) and COST.queue_s == 0
    # idle machine: predicted(k) = e * k / (b + c / s_k), s_k = min(1, C / k)
    assert V.predict(COST, 1, cores=8) == pytest.approx(1 / 6e-3)
    assert V.predict(COST, 4, cores=8) == pytest.approx(4 / 6e-3)
    assert V.predict(COST, 4, cores=2) == pytest.approx(4 / (b + c / 0.5))
    assert V.predict(COST, 4, cores=2, efficiency=0.5) == pytest.approx(0.5 * 4 / (b + c / 0.5))
    assert V.predict(COST, 64, cores=2) < 2 / c  # tends to the CPU cap C / c
    assert V.cpu_capped(COST, 4, cores=2) and not V.cpu_capped(COST, 1, cores=2)
    sleeping = V.Cost(0, 0, 0, 0, 4e-3, 0)  # no CPU at all: scales with workers
    assert V.predict(sleeping, 16, cores=1) == pytest.approx(16 / 4e-3)
    # a busy machine: one thread got half a core, so L = C / 0.5 - 1 = 3 others on 2 cores
    busy = V.Cost(0, 0, 2e-3, 1e-3, 0, 0, share=0.5)
    assert busy.queue_s == pytest.approx(1e-3) and busy.others(2) == pytest.approx(3.0)
    assert V.predict(busy, 1, cores=2) == pytest.approx(1 / 2e-3)  # = 1 / t, as measured
    assert V.predict(busy, 3, cores=2) == pytest.approx(3 / (1e-3 / (2 / 6)))  # b = 0
    with pytest.raises(ValueError):
        V.predict(COST, 0, cores=2)


def test_calibrate_takes_the_one_worker_run():
    assert V.calibrate(COST, None) == 1.0
    assert V.calibrate(COST, 0.8 / 6e-3) == pytest.approx(0.8)
    assert V.calibrate(COST, 1e-9) == 0.05  # clipped
    assert V.loader_overhead_s(COST, 0.5) == pytest.approx(6e-3)


def test_verdict_names_the_smallest_stage():
    v = V.verdict(COST, workers=2, cores=8, efficiency=1.0, model_rate=100.0)
    assert v.bound == "model" and v.gpu_busy_share == 1.0 and v.delivered == 100.0
    v = V.verdict(COST, workers=2, cores=8, efficiency=1.0, h2d_rate=50.0, model_rate=100.0)
    assert v.bound == "host-to-device" and v.gpu_busy_share == pytest.approx(0.5)
    v = V.verdict(COST, workers=1, cores=8, efficiency=1.0, model_rate=1000.0)
    assert v.bound == "augment" and v.gpu_busy_share == pytest.approx((1 / 6e-3) / 1000)
    assert v.shares["augment"] == pytest.approx(0.5)
    slow_read = V.Cost(10e-3, 1e-4, 2e-3, 2e-3, 3e-3, 3e-3)
    assert V.verdict(slow_read, workers=1, cores=8, efficiency=1.0).bound == "storage"
    # capped by the cores: CPU time decides, and the storage wait does not count
    capped = V.verdict(slow_read, workers=8, cores=1, efficiency=1.0)
    assert capped.cpu_capped and capped.bound == "augment"
    # a loader that spends most of its time moving batches
    assert V.verdict(COST, workers=1, cores=8, efficiency=0.2).bound == "loader"
    assert V.verdict(COST, workers=1, cores=8, efficiency=1.0).gpu_busy_share is None


def test_recommendations_are_ranked_with_their_figures():
    recs = C.recommend(
        COST,
        workers=2,
        cores=1,
        efficiency=1.0,
        loader_rate=V.predict(COST, 2, cores=1),
        h2d_rate=None,
        model_rate=1000.0,
        packed_read=(0.1e-3, 0.05e-3, 0.1e-3),
        decode_scaled=(0.5e-3, 0.5e-3, "decode at 1/4", 0.5e-3),
        costly_op=("Rotate", 2.5e-3, 2.5e-3, 0.8),
        more_workers=4,
    )
    actions = [r.action for r in recs]
    assert actions[0].startswith("drop or cheapen the costliest augmentation: Rotate")
    assert any(a.startswith("decode at reduced size") for a in actions)
    gains = [(r.gain, r.loader_gain) for r in recs]
    assert gains == sorted(gains, reverse=True)
    for r in recs:
        assert r.loader_after >= r.loader_before * 0.999 and r.delivered_after <= 1000.0
    # CPU-bound on 1 core: more workers gain nothing, so it is not offered
    assert not any(a.startswith("use more workers") for a in actions)
    # a model-bound run gains nothing end to end from any input change
    recs = C.recommend(
        COST,
        workers=2,
        cores=8,
        efficiency=1.0,
        loader_rate=300.0,
        h2d_rate=None,
        model_rate=10.0,
        packed_read=(0.1e-3, 0.05e-3, 0.1e-3),
    )
    assert recs[0].gain == 1.0 and recs[0].loader_gain > 1.0


def test_a_change_within_the_noise_is_not_ranked_and_a_trade_says_so():
    kw = dict(workers=1, cores=1, efficiency=1.0, h2d_rate=None, model_rate=None)
    rate = V.predict(COST, 1, cores=1)
    scaled = (0.8 * COST.decode_s, 0.8 * COST.decode_cpu_s, "decode at 1/2")
    tight = C.recommend(COST, **kw, loader_rate=rate, decode_scaled=(*scaled, scaled[0]))
    (r,) = tight
    assert r.gain > 1.0 and r.gain_lo == pytest.approx(r.loader_gain) and r.gain_lo > 1.0
    assert not r.changes_data
    # the decode's interval is +-30 %: the scaled decode at its worst gains nothing
    spreads = {"decode": (0.7, 1.3)}
    (r,) = C.recommend(
        COST, **kw, loader_rate=rate, decode_scaled=(*scaled, scaled[0]), spreads=spreads,
        trade="crops upsampled",
    )  # fmt: skip
    assert r.gain > 1.0 and r.gain_lo is not None and r.gain_lo < 1.0  # not to be ranked
    assert r.changes_data and r.detail.endswith("; crops upsampled")


def test_worker_counts_are_bounded():
    assert worker_counts(1) == [1]
    assert worker_counts(3) == [1, 2, 3]
    assert worker_counts(12) == [1, 2, 4, 8, 12]


def test_memory_check_compares_the_ring_with_available_memory():
    from stoker._core.system import memory_available_bytes

    avail = memory_available_bytes()
    assert S.check_memory(need_bytes=1 << 20, what="test").status == "ok"
    assert S.check_memory(need_bytes=int(0.75 * avail), what="big").status == "warn"
    fail = S.check_memory(need_bytes=2 * avail + (1 << 30), what="4 slots")
    assert fail.status == "fail" and "more memory" in fail.message
    assert fail.data["need_bytes"] > fail.data["available_bytes"]


def test_ulimit_check_sees_a_low_limit():
    code = (
        "import resource;"
        "s, h = resource.getrlimit(resource.RLIMIT_NOFILE);"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (60, h));"
        "from stoker.doctor.system import check_ulimit;"
        "c = check_ulimit(workers=4); print(c.status); print(c.message)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    status, message = out.splitlines()[:2]
    assert status == "fail" and "ulimit -n is 60" in message and "ulimit -n 4096" in message


def test_cores_and_threads_checks():
    assert S.check_cores(workers=8, cores=2).status == "warn"
    assert S.check_cores(workers=2, cores=2).status == "ok"
    assert usable_cores() >= 1
    over = S.check_threads(workers=8, cores=2, worker_threads=[9] * 8)
    assert over.status == "warn" and "setNumThreads(1)" in over.message
    assert S.check_threads(workers=2, cores=2, worker_threads=[2, 2]).status == "ok"


def test_start_method_check_warns_about_fork_with_threads():
    c = S.check_start_method(loader_method="forkserver")
    assert c.status == "ok" and "forkserver" in c.message
    import cv2  # noqa: F401 - a library with a thread pool is loaded

    assert S.check_start_method(loader_method="fork").status == "warn"


def test_cpu_quota_is_none_or_positive():
    q = cpu_quota()
    assert q is None or (q > 0 and math.isfinite(q))


def test_more_workers_only_while_the_measured_curve_climbs():
    assert still_rising({}, 4)  # nothing measured: the model decides
    assert still_rising({1: 100.0, 2: 190.0}, 2)
    assert not still_rising({1: 100.0, 2: 105.0}, 2)  # flat: measurement beats extrapolation
    assert not still_rising({1: 100.0, 2: 90.0}, 1)  # a larger count was already slower
