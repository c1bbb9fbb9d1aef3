"""Fixtures for the storage tests: one moto S3 server per test session on loopback, a bucket of
its own per test with the AWS variables pointing at the server, and a fault proxy in front of
it. After each test every connection the test's filesystems opened is closed (the root
``no_leaks`` check counts sockets)."""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

import pytest

from stoker.storage.remote import Remote, close_filesystems
from stoker.storage.testing import FaultProxy, S3Server


def _sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def close_and_wait(baseline: int, deadline: float = 3.0) -> None:
    """Close the filesystems' connections, then wait until the server side of each is closed
    too (the server's threads see the client's FIN a moment later)."""
    close_filesystems()
    end = time.monotonic() + deadline
    while _sockets() > baseline and time.monotonic() < end:
        time.sleep(0.02)


@pytest.fixture(scope="session", autouse=True)
def _fsspec_loop():
    """fsspec's I/O thread and its event loop (whose self-pipe is a socket pair) live as long as
    the process; start them before the first test so the leak check sees them as already
    there."""
    import fsspec.asyn

    fsspec.asyn.get_loop()
    yield


@pytest.fixture(scope="session")
def s3_server():
    with S3Server() as server:
        yield server


@dataclass
class S3:
    server: S3Server
    bucket: str

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"


def _clean_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No credential from the developer's own environment or ~/.aws reaches a test."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    """The session's S3 server, the AWS variables set for it, and a fresh bucket."""
    baseline = _sockets()
    _clean_aws_env(monkeypatch, tmp_path)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    Remote(f"s3://{bucket}").fs().mkdir(bucket)
    yield S3(s3_server, bucket)
    close_and_wait(baseline)


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """An environment without any AWS credential."""
    baseline = _sockets()
    _clean_aws_env(monkeypatch, tmp_path)
    yield
    close_and_wait(baseline)


@pytest.fixture
def proxy(s3):
    """A FaultProxy in front of the S3 server (started; stopped after the test)."""
    with FaultProxy(s3.endpoint) as p:
        yield p
        close_filesystems()
