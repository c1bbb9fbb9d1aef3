"""Fixtures for the storage tests: one moto S3 server per test session on loopback, a bucket of
its own per test with the AWS variables pointing at the server, and a fault proxy in front of
it. After each test every connection the test's filesystems opened is closed (the root
``no_leaks`` check counts sockets)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stoker.storage.remote import close_filesystems
from storage_doubles import FaultProxy, S3Server


@dataclass
class S3:
    server: S3Server
    bucket: str

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    def url(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"


@pytest.fixture
def s3(s3_server, s3_bucket):
    """The session's S3 server, the AWS variables set for it, and a fresh bucket."""
    return S3(s3_server, s3_bucket)


@pytest.fixture
def proxy(s3):
    """A FaultProxy in front of the S3 server (started; stopped after the test)."""
    with FaultProxy(s3.endpoint) as p:
        yield p
        close_filesystems()
