"""Faults between stoker and S3, injected by a real proxy on loopback in front of moto's server:
each download is byte-exact after its retries and resumes where it stopped, or fails at once
with an error that names the URL (without credentials), what was read and the byte range."""

from __future__ import annotations

import io
import os
import time

import pytest

from stoker._core.errors import StorageError
from stoker.storage.remote import Remote
from storage_doubles import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY

CHUNK = 256 * 1024
SIZE = 4 * CHUNK + 12345  # five ranges, the last one short


def _no_secret(text: str) -> None:
    assert FAKE_ACCESS_KEY_ID not in text and FAKE_SECRET_ACCESS_KEY not in text


@pytest.fixture
def shard(s3, proxy, tmp_path):
    """A shard in the bucket and a Remote that reaches it through the proxy."""
    data = os.urandom(SIZE)
    local = tmp_path / "train-00003.rec"
    local.write_bytes(data)
    Remote(s3.url()).upload(str(local), s3.url("sets/train-00003.rec"))
    remote = Remote(
        s3.url("sets"),
        storage_options={"endpoint_url": proxy.endpoint},
        retries=3,
        backoff=0.01,
        timeout=0.5,
        chunk=CHUNK,
    )
    proxy.clear()
    return remote, s3.url("sets/train-00003.rec"), data


def _ranges(proxy) -> list[str]:
    return [r for m, p, r in proxy.requests if m == "GET" and "train-00003.rec" in p]


@pytest.mark.parametrize(
    "kind", ["reset", "truncate", "stall", "503", "slowdown", "reset-at-header"]
)
def test_a_transient_fault_mid_object_is_retried_and_resumes_byte_exact(shard, proxy, kind):
    remote, url, data = shard
    after = 0 if kind == "reset-at-header" else 100_000
    # the third range fails; the first two are kept, not fetched again
    proxy.inject(kind.split("-")[0], match="train-00003.rec", skip=2, after_bytes=after)
    out = io.BytesIO()
    remote.download(url, out, size=SIZE, what="shard 3 (train-00003.rec)")
    assert out.getvalue() == data
    third = f"bytes={2 * CHUNK}-{3 * CHUNK - 1}"
    assert _ranges(proxy) == [
        f"bytes=0-{CHUNK - 1}",
        f"bytes={CHUNK}-{2 * CHUNK - 1}",
        third,
        third,  # the retry resumes at the first byte not written
        f"bytes={3 * CHUNK}-{4 * CHUNK - 1}",
        f"bytes={4 * CHUNK}-{SIZE}",  # one byte past the end: a longer object is caught
    ]


def test_faults_on_every_attempt_end_in_an_error_naming_url_shard_and_range(shard, proxy):
    remote, url, _ = shard
    proxy.inject("reset", match="train-00003.rec", skip=1, times=100, after_bytes=1000)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        remote.download(url, io.BytesIO(), size=SIZE, what="shard 3 (train-00003.rec)")
    msg = str(info.value)
    assert url in msg and "shard 3 (train-00003.rec)" in msg
    assert f"bytes {CHUNK}-{SIZE} of {SIZE}" in msg and "failed 4 times" in msg
    _no_secret(msg)
    assert len(_ranges(proxy)) == 1 + 4  # the first range, then 1 + retries attempts
    assert time.monotonic() - started < 5.0


def test_a_stall_on_every_attempt_is_bounded_by_the_timeout(shard, proxy):
    remote, url, _ = shard
    proxy.inject("stall", match="train-00003.rec", times=100, after_bytes=10)
    started = time.monotonic()
    with pytest.raises(StorageError, match="failed 4 times") as info:
        remote.download(url, io.BytesIO(), size=SIZE, what="shard 3")
    assert time.monotonic() - started < 4 * 0.5 + 2.0
    assert "Timeout" in str(info.value) or "timeout" in str(info.value).lower()


def test_a_404_is_file_not_found_at_once(shard, proxy):
    remote, url, _ = shard
    remote.size(url)  # the client is made before the clock starts
    proxy.clear()
    proxy.inject("404", match="train-00003.rec", skip=1, times=100)
    started = time.monotonic()
    with pytest.raises(FileNotFoundError) as info:
        remote.download(url, io.BytesIO(), size=SIZE, what="shard 3 (train-00003.rec)")
    msg = str(info.value)
    assert url in msg and "shard 3 (train-00003.rec)" in msg and f"bytes {CHUNK}-" in msg
    assert len(_ranges(proxy)) == 2  # not retried
    assert time.monotonic() - started < 2.0
    _no_secret(msg)


def test_refused_credentials_fail_at_once(shard, proxy):
    remote, url, _ = shard
    remote.size(url)  # the client is made (a second under load) before the clock starts
    proxy.clear()
    proxy.inject("403", match="train-00003.rec", times=100)
    started = time.monotonic()
    with pytest.raises(PermissionError, match="credentials") as info:
        remote.download(url, io.BytesIO(), size=SIZE, what="shard 3")
    assert time.monotonic() - started < 2.0
    assert len(_ranges(proxy)) == 1
    msg = str(info.value)
    assert url in msg and "shard 3" in msg and "Access Key Id you provided" in msg
    _no_secret(msg)


def test_size_and_listing_retry_a_503(shard, proxy):
    remote, url, _ = shard
    proxy.inject("slowdown", match="train-00003.rec", times=2)
    assert remote.size(url) == SIZE
    assert [m for m, _, _ in proxy.requests].count("HEAD") == 3
    proxy.inject("503", match="list-type", times=1)
    assert remote.listing(url.rsplit("/", 1)[0]) == {"train-00003.rec": SIZE}


def test_an_upload_is_retried_whole_after_a_503(s3, proxy, tmp_path):
    remote = Remote(
        s3.url(), storage_options={"endpoint_url": proxy.endpoint}, retries=2, backoff=0.01
    )
    local = tmp_path / "x.rec"
    local.write_bytes(os.urandom(50_000))
    proxy.inject("503", match="x.rec", times=1)
    remote.upload(str(local), s3.url("x.rec"))
    assert [m for m, p, _ in proxy.requests if "x.rec" in p] == ["PUT", "PUT", "HEAD"]
    out = io.BytesIO()
    Remote(s3.url()).download(s3.url("x.rec"), out, size=50_000)
    assert out.getvalue() == local.read_bytes()


def test_latency_and_bandwidth_are_applied(shard, proxy):
    remote, url, data = shard
    proxy.latency, proxy.bandwidth = 0.05, 8 * 1024 * 1024
    started = time.monotonic()
    out = io.BytesIO()
    remote.download(url, out, size=SIZE)
    took = time.monotonic() - started
    assert out.getvalue() == data
    assert took >= 5 * 0.05 + SIZE / (8 * 1024 * 1024) * 0.9
