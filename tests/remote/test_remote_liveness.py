"""The remote path never stalls: every loader over a set in object storage either delivers the
batches of the same set on local disk, or is refused at open with ``CacheFullError`` naming
what it needs. Each test runs under a watchdog: a run that delivers nothing within its bound
fails (the module's timeout, and a join deadline on the threads that play ranks)."""

from __future__ import annotations

import gc
import json
import os
import shutil
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stoker
from stoker._core.errors import size_text
from storage_doubles import upload_tree

pytestmark = pytest.mark.timeout(150)

WATCHDOG_S = 60.0  # no run of these small sets takes a tenth of this when it does not stall


def _batches(ld) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    with ld:
        return [(b.images.copy(), np.asarray(b.labels).copy(), b.keys.copy()) for b in ld]


def _same(a, b) -> None:
    assert len(a) == len(b)
    for (xa, ya, ka), (xb, yb, kb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)


def _shard_room(manifest: str) -> int:
    """The largest shard's bytes in the cache: .rec, .idx and .crc32c with their markers."""
    from stoker.storage.cache import MARKER_RESERVE

    folder = os.path.dirname(manifest)
    with open(manifest) as f:
        shards = json.load(f)["shards"]
    return max(
        sum(os.path.getsize(os.path.join(folder, name)) for name in s["files"].values())
        + 3 * MARKER_RESERVE
        for s in shards
    )


def test_shard_order_over_a_cache_under_its_working_set_is_refused_at_open(remote_set, tmp_path):
    # window 4 and two shards ahead: the batches in flight touch up to 8 shards, so the order
    # needs 10 shards' room; a cache of 0.45 x the 15-shard set holds fewer than 7
    room = _shard_room(remote_set.local)
    sizes = [os.path.getsize(os.path.join(os.path.dirname(remote_set.local), n))
             for n in os.listdir(os.path.dirname(remote_set.local))]  # fmt: skip
    small = int(0.45 * sum(sizes))
    kw = dict(batch_size=2, seed=7, shuffle="shards", workers=2, prefetch_shards=2)
    with pytest.raises(stoker.CacheFullError) as e:
        stoker.Loader(remote_set.url, cache_dir=str(tmp_path / "a"), cache_limit=small, **kw)
    text = str(e.value)
    assert f"needs {size_text(10 * room)}" in text and f"budget is {size_text(small)}" in text
    assert "cache_limit" in text and "window" in text
    # with the room it names, the same order runs and gives the local batches
    want = _batches(stoker.Loader(remote_set.local, **kw))
    got = _batches(
        stoker.Loader(remote_set.url, cache_dir=str(tmp_path / "b"), cache_limit=10 * room, **kw)
    )
    _same(got, want)


def test_a_dataset_over_a_small_cache_reads_its_classes_without_waiting_on_itself(
    remote_set, tmp_path
):
    pytest.importorskip("torch")
    from stoker.torch import RecordDataset

    room = _shard_room(remote_set.local)
    local = RecordDataset(remote_set.local)
    # four shards' room: what a reader outside a loader keeps open, nothing to spare
    remote = RecordDataset(remote_set.url, cache_dir=str(tmp_path / "c"), cache_limit=4 * room)
    assert remote.classes == local.classes
    assert len(remote) == len(local)
    for i in (0, 31, 59):
        assert remote[i][1] == local[i][1]


def _run_ranks(make, world: int) -> list[object]:
    """Each rank's batches (or the exception it raised), the ranks as threads at once; a rank
    that neither finishes nor fails within the watchdog fails the test."""
    out: list[object] = [None] * world

    def one(rank: int) -> None:
        try:
            out[rank] = _batches(make(rank))
        except BaseException as exc:  # noqa: BLE001 - reported below
            out[rank] = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WATCHDOG_S)
        assert not t.is_alive(), f"a rank delivered nothing for {WATCHDOG_S} s: the loader stalls"
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("liveness")
    stoker.make_sample_data(root / "img", classes=3, per_class=10, size=24, seed=9, workers=1)
    return root / "img"


ORDERS = st.one_of(st.booleans(), st.integers(1, 6))  # an int: shuffle="shards" with that window


@st.composite
def configurations(draw):
    return {
        "images": draw(st.integers(6, 30)),
        "shard_size": draw(st.integers(1, 6)),
        "order": draw(ORDERS),
        "ahead": draw(st.integers(0, 3)),
        "workers": draw(st.integers(0, 3)),
        "ranks": draw(st.integers(1, 3)),
        "batch": draw(st.integers(1, 5)),
        "budget": draw(st.floats(0.05, 1.3)),
    }


def _check_configuration(cfg, images, s3env, tmp_path) -> str:
    case = tmp_path / f"case-{os.urandom(4).hex()}"
    src = case / "img"
    names = sorted(p for p in images.rglob("*.jpg"))[: cfg["images"]]
    for p in names:
        (src / p.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(p, src / p.parent.name / p.name)
    stoker.pack(src, case / "set" / "s", shard_size=cfg["shard_size"], workers=1, progress=False)
    prefix = f"sets-{case.name}"
    upload_tree(case / "set", f"s3://{s3env}/{prefix}")
    local = str(case / "set" / "s.stoker.json")
    url = f"s3://{s3env}/{prefix}/s.stoker.json"
    with open(local) as f:
        counts = [s["records"] for s in json.load(f)["shards"]]
    if cfg["ranks"] > sum(1 for c in counts if c):
        return "skipped"
    total = sum(os.path.getsize(case / "set" / n) for n in os.listdir(case / "set"))
    limit = max(1, int(cfg["budget"] * total))
    cache = str(case / "cache")  # one cache folder for every rank

    def make(rank: int, where: str, **extra):
        order = cfg["order"]
        kw: dict = dict(batch_size=cfg["batch"], seed=5, workers=cfg["workers"],
                        rank=rank, world_size=cfg["ranks"], timeout=WATCHDOG_S)  # fmt: skip
        if isinstance(order, bool):
            kw["shuffle"] = order
        else:
            kw["sampler"] = stoker.sampling.ShardOrder(
                np.array(counts), window=order, seed=5, rank=rank, world_size=cfg["ranks"]
            )
        return stoker.Loader(where, **kw, **extra)

    want = [_batches(make(r, local)) for r in range(cfg["ranks"])]
    got = _run_ranks(
        lambda r: make(r, url, cache_dir=cache, cache_limit=limit, prefetch_shards=cfg["ahead"]),
        cfg["ranks"],
    )
    refused = [g for g in got if isinstance(g, stoker.CacheFullError)]
    for g in got:
        if isinstance(g, BaseException) and not isinstance(g, stoker.CacheFullError):
            raise g
    for rank, g in enumerate(got):
        if not isinstance(g, BaseException):
            _same(g, want[rank])  # a rank that ran read exactly what it reads locally
    return "refused" if refused else "ran"


def _property(max_examples: int):
    @settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(cfg=configurations())
    def check(cfg, images, s3env, tmp_path):
        _check_configuration(cfg, images, s3env, tmp_path)

    return check


def test_every_configuration_runs_as_locally_or_is_refused_at_open(images, s3env, tmp_path):
    _property(6)(images=images, s3env=s3env, tmp_path=tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_configuration_runs_as_locally_or_is_refused_at_open_many(images, s3env, tmp_path):
    _property(120)(images=images, s3env=s3env, tmp_path=tmp_path)


def test_dataloader_workers_that_cannot_all_hold_their_shards_are_refused(
    remote_set, tmp_path, monkeypatch
):
    torch = pytest.importorskip("torch")
    # torch stops an iterator whose worker raised by joining each worker for this long, then
    # ending it; 0.5 s rather than 5 (10 s of the test's 11 went there)
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.5)
    from stoker.torch import RecordDataset

    room = _shard_room(remote_set.local)
    # each DataLoader worker keeps up to four shards open: two need eight, the cache holds six
    ds = RecordDataset(remote_set.url, cache_dir=str(tmp_path / "d"), cache_limit=6 * room)
    dl = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2)
    it = iter(dl)
    with pytest.raises(stoker.CacheFullError, match="fewer DataLoader workers"):
        for _ in it:
            pass
    del it  # its workers stop, and their claims go with them
    gc.collect()
    # one worker fits, and reads
    dl = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=1)
    assert len(next(iter(dl))[1]) == 4
