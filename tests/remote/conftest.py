"""Fixtures for reading sets from object storage: moto's S3 server on loopback for the session,
a small packed set with shards of unequal sizes, and a fresh bucket per test with the set
uploaded to it. Each test gets its own shard cache (``cache_dir``)."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

import pytest

import stoker
from stoker.storage.remote import Remote, close_filesystems
from stoker.storage.testing import FaultProxy, S3Server


@pytest.fixture(scope="session")
def s3_server():
    import fsspec.asyn

    fsspec.asyn.get_loop()  # fsspec's I/O thread and its event loop live as long as the process
    with S3Server() as server:
        yield server


@pytest.fixture(scope="session")
def packed(tmp_path_factory) -> str:
    """A packed set: 3 classes x 20 images (60 records, 48 px) in 15 shards of 4, with
    per-record checksums. Returns its folder."""
    root = tmp_path_factory.mktemp("remote-set")
    stoker.make_sample_data(root / "images", classes=3, per_class=20, size=48, seed=3, workers=1)
    stoker.pack(root / "images", root / "out" / "train", shard_size=4, workers=1, progress=False)
    return str(root / "out")


@dataclass
class RemoteSet:
    bucket: str
    local: str  # the local manifest
    url: str  # the same set's manifest in the bucket
    server: S3Server

    def key_url(self, name: str) -> str:
        return f"s3://{self.bucket}/sets/{name}"


def _clean_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))


def upload_folder(folder: str, bucket: str, prefix: str = "sets") -> None:
    r = Remote(f"s3://{bucket}")
    for name in sorted(os.listdir(folder)):
        r.upload(os.path.join(folder, name), f"s3://{bucket}/{prefix}/{name}")


def _sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def _close_and_wait(baseline: int) -> None:
    """Close this process's storage connections and wait for the server's ends to close."""
    close_filesystems()
    end = time.monotonic() + 3.0
    while _sockets() > baseline and time.monotonic() < end:
        time.sleep(0.02)


@pytest.fixture
def s3env(s3_server, monkeypatch, tmp_path):
    """The AWS variables pointing at the session's server, and a fresh bucket's name."""
    baseline = _sockets()
    _clean_aws_env(monkeypatch, tmp_path)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"r-{uuid.uuid4().hex[:16]}"
    Remote(f"s3://{bucket}").fs().mkdir(bucket)
    yield bucket
    _close_and_wait(baseline)


@pytest.fixture
def remote_set(s3env, s3_server, packed) -> RemoteSet:
    upload_folder(packed, s3env)
    return RemoteSet(
        s3env,
        os.path.join(packed, "train.stoker.json"),
        f"s3://{s3env}/sets/train.stoker.json",
        s3_server,
    )


@pytest.fixture
def cache_dir(tmp_path) -> str:
    return str(tmp_path / "shard-cache")


@pytest.fixture
def proxy(s3_server):
    with FaultProxy(s3_server.endpoint) as p:
        yield p
        close_filesystems()
