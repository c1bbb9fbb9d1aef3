"""Fixtures for reading sets from object storage: moto's S3 server on loopback for the session,
a small packed set with shards of unequal sizes, and a fresh bucket per test with the set
uploaded to it. Each test gets its own shard cache (``cache_dir``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

import stoker
from stoker.storage.remote import close_filesystems
from storage_doubles import FaultProxy, S3Server, upload_tree


def pytest_collection_modifyitems(config, items):
    """The liveness watchdog: a remote test that delivers nothing fails within its bound
    rather than hangs (modules may set a longer one of their own)."""
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(120))


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


def upload_folder(folder: str, bucket: str, prefix: str = "sets") -> None:
    upload_tree(folder, f"s3://{bucket}/{prefix}")


@pytest.fixture
def s3env(s3_bucket):
    """A fresh bucket's name, the AWS variables set for the session's server."""
    return s3_bucket


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
