"""Faults between the loader and object storage: retried without losing or repeating a record;
one download per shard per node however many ranks and workers read it; manifests that try to
send the reader elsewhere are refused; no credential reaches an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest

import stoker
from stoker.storage.remote import Remote
from storage_doubles import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY

pytestmark = pytest.mark.timeout(150)


def _keys(ld) -> list[np.ndarray]:
    with ld:
        return [b.keys.copy() for b in ld]


@pytest.mark.parametrize(
    "kind",  # the default run: a dropped connection and a 503; the rest of the matrix is slow
    ["reset", "503", *(pytest.param(k, marks=pytest.mark.slow) for k in ("slowdown", "truncate"))],
)
def test_transient_faults_mid_shard_lose_and_repeat_nothing(
    remote_set, cache_dir, proxy, monkeypatch, kind
):
    kw = dict(batch_size=8, seed=3, shuffle=True, workers=2)
    want = _keys(stoker.Loader(remote_set.local, **kw))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    # the first two reads of two different shards fail part-way (or at once)
    proxy.inject(kind, times=2, match="train-00003.rec", after_bytes=700)
    proxy.inject(kind, times=1, match="train-00008.rec", after_bytes=300)
    got = _keys(stoker.Loader(remote_set.url, cache_dir=cache_dir, **kw))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    hit = [r for r in proxy.requests if "train-00003.rec" in r[1] and r[0] == "GET"]
    assert len(hit) >= 3  # two failed tries, then the rest of the object


@pytest.mark.slow  # 10 s of retries; the CLI and storage fault tests name failing URLs by default
def test_a_shard_that_keeps_failing_is_named_with_its_url(
    remote_set, cache_dir, proxy, monkeypatch
):
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    proxy.inject("503", times=1000, match="train-00004.rec")
    ld = stoker.Loader(remote_set.url, batch_size=60, workers=0, cache_dir=cache_dir, shuffle=False)
    with ld, pytest.raises(stoker.StorageError) as e:
        next(iter(ld))
    msg = str(e.value)
    assert "train-00004.rec" in msg and remote_set.bucket in msg
    assert FAKE_SECRET_ACCESS_KEY not in msg and FAKE_ACCESS_KEY_ID not in msg


_RANK = textwrap.dedent(
    """
    import json, sys
    import stoker
    url, cache, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ld = stoker.Loader(url, batch_size=4, seed=9, shuffle=True, rank=rank, world_size=2,
                       workers=2, cache_dir=cache, prefetch_shards=2)
    keys = []
    with ld:
        for b in ld:
            keys += [int(k) for k in b.keys]
    print(json.dumps(keys))
    """
)


def test_one_download_per_shard_per_node_for_two_ranks_of_two_workers(remote_set, cache_dir, proxy):
    env = dict(os.environ, AWS_ENDPOINT_URL=proxy.endpoint)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, remote_set.url, cache_dir, str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    with open(remote_set.local) as f:
        shards = json.load(f)["shards"]
    gets = Counter(r[1].rsplit("/", 1)[-1].split("?")[0] for r in proxy.requests if r[0] == "GET")
    for s in shards:
        assert gets[s["files"]["data"]] == 1, gets  # each shard downloaded once by the whole node
    got = sorted(k for out, _ in outs for k in json.loads(out))
    assert len(got) == sum(s["records"] for s in shards)  # 60 records over 2 ranks: no padding


@pytest.mark.parametrize(
    "name",
    [
        "../elsewhere/train-00000.rec",
        "s3://another-bucket/train-00000.rec",
        "file:///etc/passwd",
        "http://169.254.169.254/latest/meta-data",
        "sub/%2e%2e/%2e%2e/x.rec",
    ],
)
def test_a_manifest_cannot_send_the_reader_elsewhere(remote_set, cache_dir, name):
    with open(remote_set.local) as f:
        m = json.load(f)
    m["shards"][1]["files"]["data"] = name
    url = remote_set.key_url("hostile.stoker.json")
    Remote(url).fs().pipe_file(
        f"{remote_set.bucket}/sets/hostile.stoker.json", json.dumps(m).encode()
    )
    with pytest.raises(stoker.ManifestError, match=r"shards\[1\]") as e:
        stoker.Loader(url, batch_size=4, workers=0, cache_dir=cache_dir)
    assert FAKE_SECRET_ACCESS_KEY not in str(e.value)


def test_refused_credentials_fail_fast(remote_set, cache_dir, proxy, monkeypatch):
    import time

    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    proxy.inject("403", times=1000)  # the server refuses the key (InvalidAccessKeyId)
    t0 = time.monotonic()
    with pytest.raises(PermissionError) as e:
        stoker.Loader(remote_set.url, batch_size=4, workers=0, cache_dir=cache_dir)
    assert time.monotonic() - t0 < 5  # no retry loop on a refusal
    assert FAKE_SECRET_ACCESS_KEY not in str(e.value) and FAKE_ACCESS_KEY_ID not in str(e.value)
