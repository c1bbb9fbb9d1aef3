"""`stoker doctor` on a set's manifest URL (moto's S3 server on loopback, the CLI in a child
process with the server's AWS_* environment): one shard's download measured without the cache,
the cache's figures, and whether the cache bounds the run under each shuffle mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import stoker
from stoker.doctor.measure.storage import RemoteStorage
from storage_doubles import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, upload_tree

pytestmark = pytest.mark.timeout(180)

FAST = ["--seconds", "0.2", "--sample-size", "16", "--workers-max", "1"]


def doctor(*args: str) -> subprocess.CompletedProcess:
    p = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "doctor", *args],
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=150,
    )
    for secret in (FAKE_SECRET_ACCESS_KEY, FAKE_ACCESS_KEY_ID):
        assert secret not in p.stdout and secret not in p.stderr
    assert p.returncode == 0, p.stderr[-2000:]
    return p


@pytest.fixture(autouse=True)
def _own_stoker_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "stoker-cache"))


def _cached_bytes(folder: str) -> tuple[int, int]:
    """What readers cache of the local copy (every .rec, .idx and .crc32c) and its largest
    shard's part of that."""
    per: dict[str, int] = {}
    for name in os.listdir(folder):
        if name.endswith((".rec", ".idx", ".crc32c")):
            stem = name.rsplit(".", 1)[0]
            per[stem] = per.get(stem, 0) + os.path.getsize(os.path.join(folder, name))
    return sum(per.values()), max(per.values())


def test_doctor_on_a_url_measures_the_download_and_judges_the_cache(remote_set, cache_dir):
    set_bytes, largest = _cached_bytes(os.path.dirname(remote_set.local))
    common = [remote_set.url, "--json", "--no-loader", "--cache-dir", cache_dir, *FAST]
    d = json.loads(doctor(*common, "--cache-limit", "40K").stdout)
    assert d["source"]["path"] == remote_set.url and d["source"]["count"] == 60
    r = d["source"]["remote"]
    assert r["url"] == remote_set.url and r["shard"].startswith(remote_set.key_url("train-"))
    assert r["mb_per_s"] > 0 and r["ttfb_ms"] > 0 and r["download_s"] > 0 and r["shard_bytes"] > 0
    assert r["cache_dir"] == os.path.abspath(cache_dir) and r["cache_limit"] == 40 * 1024
    assert r["cache_free"] > 0 and 0 < r["cache_used"] <= 40 * 1024
    assert (r["set_bytes"], r["largest_shard_bytes"], r["shards"]) == (set_bytes, largest, 15)
    assert d["source"]["total_bytes"] == set_bytes
    # a set larger than the budget under a global shuffle: such a loader is refused at open
    assert r["shuffle"] == "true" and r["holds_set"] is False and r["bounds"] is True
    assert "refused at open" in r["text"] and 'shuffle="shards"' in r["text"]
    # the uncached download's temporary file is gone
    assert not [n for n in os.listdir(cache_dir) if n.startswith(".stoker-doctor-")]

    shards = [*common, "--cache-limit", "40K", "--shuffle", "shards", "--window", "1"]
    r = json.loads(doctor(*shards, "--prefetch-shards", "1").stdout)["source"]["remote"]
    assert r["shuffle"] == "shards" and r["window"] == 1 and r["prefetch_shards"] == 1
    assert r["shards_need"] == 3 * largest <= 40 * 1024
    assert r["bounds"] is False and "the budget is enough" in r["text"]


@pytest.mark.parametrize("fmt", ["tfrecord", "wds"])
def test_doctor_measures_the_download_of_every_format(fmt, s3env, packed, tmp_path, cache_dir):
    """A TFRecord and a WebDataset set in object storage get the same download measurement as
    a RecordIO one (through the reader's files, not a format's internals)."""
    folder = tmp_path / fmt
    stoker.convert(os.path.join(packed, "train.stoker.json"), folder / "train", format=fmt,
                   shard_size=4, workers=1, progress=False)  # fmt: skip
    upload_tree(str(folder), f"s3://{s3env}/{fmt}")
    url = f"s3://{s3env}/{fmt}/train.stoker.json"
    d = json.loads(doctor(url, "--json", "--no-loader", "--cache-dir", cache_dir, *FAST).stdout)
    r = d["source"]["remote"]
    assert r["url"] == url and r["shard"].startswith(f"s3://{s3env}/{fmt}/train-")
    assert r["download_s"] > 0 and r["ttfb_ms"] > 0 and r["mb_per_s"] > 0 and r["shards"] == 15
    with open(folder / "train.stoker.json") as f:
        sizes = [os.path.getsize(folder / s["files"]["data"]) for s in json.load(f)["shards"]]
    assert r["shard_bytes"] == max(sizes) and r["set_bytes"] >= sum(sizes)


@pytest.mark.slow
def test_doctor_text_report_on_a_url_with_the_loader(remote_set, cache_dir):
    out = doctor(remote_set.url, "--cache-dir", cache_dir, *FAST).stdout
    assert "Storage (object storage, through the shard cache)" in out
    assert "MB/s" in out and "time to first byte" in out
    assert "The cache does not bound the run" in out and "holds the whole set" in out
    assert "Loader (stoker.Loader)" in out and "loader (1 workers)" not in out  # it ran


def _figures(**kw) -> RemoteStorage:
    base = dict(
        url="s3://b/sets/train.stoker.json",
        shard="s3://b/sets/train-00000.rec",
        shard_bytes=100 * 10**6,
        download_s=2.0,
        ttfb_s=0.02,
        cache_dir="/cache",
        cache_limit=10 * 10**9,
        cache_used=0,
        cache_free=500 * 10**9,
        set_bytes=50 * 10**9,
        shards=500,
        largest_shard_bytes=100 * 10**6,
        record_bytes=100_000.0,
        shuffle="true",
        window=4,
        prefetch_shards=2,
    )
    base.update(kw)
    return RemoteStorage(**base)  # type: ignore[arg-type]


def test_the_cache_verdict_for_each_case():
    r = _figures()  # 50 GB set, 10 GB budget, global shuffle
    assert r.mb_per_s == 50 and r.samples_per_s == 500 and r.epoch_s() == 1000
    assert r.bounds and "refused at open" in r.verdict()
    assert "downloading the set once takes (about 1,000 s" in r.verdict()
    assert "cache_limit of at least 50.0 GB" in r.verdict()
    r = _figures(shuffle="shards")  # needs (2 * 4 + 2) * 100 MB = 1 GB: enough
    assert r.shards_need == 10**9 and not r.bounds and "the budget is enough" in r.verdict()
    r = _figures(shuffle="shards", cache_limit=900 * 10**6)
    assert r.bounds and 'smaller than what shuffle="shards" keeps cached' in r.verdict()
    assert "refused at open" in r.verdict()
    r = _figures(cache_limit=60 * 10**9)
    assert r.holds_set and not r.bounds and "holds the whole set" in r.verdict()
    r = _figures(cache_limit=60 * 10**9, cache_free=20 * 10**9)  # the disk cannot hold it
    assert r.budget == 20 * 10**9 and r.bounds and "the disk leaves 20.0 GB" in r.verdict()
