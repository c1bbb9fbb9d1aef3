"""Remote against a real S3 server (moto on loopback, through s3fs), a local folder, and a
loopback HTTP server that redirects."""

from __future__ import annotations

import http.server
import io
import os
import pickle
import threading
import time

import pytest

from stoker._core.errors import ManifestError, StorageError
from stoker.storage.remote import Remote
from storage_doubles import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY


def _put(remote: Remote, tmp_path, url: str, data: bytes) -> None:
    local = tmp_path / f"up-{len(data)}-{time.monotonic_ns()}"
    local.write_bytes(data)
    remote.upload(str(local), url)


def _no_secret(text: str) -> None:
    assert FAKE_ACCESS_KEY_ID not in text and FAKE_SECRET_ACCESS_KEY not in text


def test_round_trip_upload_size_listing_download_remove(s3, tmp_path):
    remote = Remote(s3.url("sets/"), chunk=64 * 1024)
    data = {f"train-{i:05d}.rec": os.urandom(100_000 + i) for i in range(3)}
    for name, blob in data.items():
        _put(remote, tmp_path, s3.url(f"sets/{name}"), blob)
    _put(remote, tmp_path, s3.url("sets/sub/deeper.rec"), b"x")
    assert remote.listing(s3.url("sets")) == {k: len(v) for k, v in data.items()}
    assert remote.listing(s3.url("sets/")) == {k: len(v) for k, v in data.items()}
    for name, blob in data.items():
        url = s3.url(f"sets/{name}")
        assert remote.size(url) == len(blob) and remote.exists(url)
        out = io.BytesIO()
        remote.download(url, out, size=len(blob), what=f"shard ({name})")
        assert out.getvalue() == blob
    with open(tmp_path / "file.bin", "wb") as f:  # a real file, opened "wb"
        remote.download(s3.url("sets/train-00001.rec"), f, size=100_001)
    assert (tmp_path / "file.bin").read_bytes() == data["train-00001.rec"]
    remote.remove(s3.url("sets/train-00000.rec"))
    remote.remove(s3.url("sets/train-00000.rec"))  # already gone: not an error
    assert not remote.exists(s3.url("sets/train-00000.rec"))
    assert "train-00000.rec" not in remote.listing(s3.url("sets"))


def test_download_of_an_empty_object(s3, tmp_path):
    remote = Remote(s3.url())
    _put(remote, tmp_path, s3.url("empty.rec"), b"")
    out = io.BytesIO(b"old bytes")
    remote.download(s3.url("empty.rec"), out, size=0)
    assert out.getvalue() == b""


def test_a_missing_object_is_file_not_found_naming_the_url(s3):
    remote = Remote(s3.url())
    url = s3.url("sets/train-00007.rec")
    with pytest.raises(FileNotFoundError, match="s3://.*/sets/train-00007.rec") as info:
        remote.size(url)
    with pytest.raises(FileNotFoundError, match=r"shard 7 \(train-00007.rec\)"):
        remote.download(url, io.BytesIO(), size=10, what="shard 7 (train-00007.rec)")
    assert not remote.exists(url)
    _no_secret(str(info.value))


def test_read_bytes_refuses_an_object_over_its_cap_before_reading_it(s3, proxy, tmp_path):
    remote = Remote(s3.url(), storage_options={"endpoint_url": proxy.endpoint})
    _put(remote, tmp_path, s3.url("m.stoker.json"), b"{}" * 1000)
    assert remote.read_bytes(s3.url("m.stoker.json"), max_bytes=2000) == b"{}" * 1000
    proxy.clear()
    with pytest.raises(ManifestError, match="2000 bytes, more than the 1999"):
        remote.read_bytes(s3.url("m.stoker.json"), max_bytes=1999)
    assert [m for m, _, _ in proxy.requests] == ["HEAD"]  # no body was read


def test_an_object_longer_or_shorter_than_expected_is_an_error(s3, tmp_path):
    remote = Remote(s3.url(), retries=2, backoff=0.01, chunk=1000)
    _put(remote, tmp_path, s3.url("a.rec"), bytes(2500))
    with pytest.raises(ManifestError, match="longer than the 2400 bytes"):
        remote.download(s3.url("a.rec"), io.BytesIO(), size=2400, what="shard 0")
    out = io.BytesIO()
    with pytest.raises(StorageError, match=r"bytes 2500-2600 of 2600 failed 3 times") as info:
        remote.download(s3.url("a.rec"), out, size=2600, what="shard 0")
    assert "shorter than expected" in str(info.value)
    assert out.getvalue() == bytes(2500)  # what arrived is kept, nothing twice


def test_remote_pickles_without_its_filesystem_and_hides_storage_options(s3, tmp_path):
    remote = Remote(s3.url(), storage_options={"key": "sekrit-key", "secret": "sekrit-value"})
    remote.fs()  # made in this process; not part of the pickle
    clone = pickle.loads(pickle.dumps(remote))
    assert clone == remote
    for text in (repr(remote), str(remote)):
        assert "sekrit" not in text and s3.bucket in text
    assert "_fs" not in vars(clone)


def test_remote_refuses_urls_off_its_root_and_bad_settings(s3):
    remote = Remote(s3.url("sets"))
    with pytest.raises(ValueError, match="not on the storage"):
        remote.size("s3://another-bucket/x.rec")
    with pytest.raises(ValueError, match="not on the storage"):
        remote.size("file:///etc/passwd")
    with pytest.raises(ValueError, match="scheme 'ftp' is not allowed"):
        Remote("ftp://host/x")
    with pytest.raises(ValueError, match="metadata"):
        Remote("http://169.254.169.254/latest")
    with pytest.raises(ValueError, match="retries"):
        Remote(s3.url(), retries=-1)
    with pytest.raises(ValueError, match="timeout"):
        Remote(s3.url(), timeout=0)


def test_a_local_folder_round_trip_writes_atomically(tmp_path):
    root = tmp_path / "out"
    remote = Remote(str(root))
    assert remote.root == f"file://{root}"
    src = tmp_path / "src.bin"
    src.write_bytes(b"abc" * 1000)
    remote.upload(str(src), f"file://{root}/d/a.rec")
    assert sorted(os.listdir(root / "d")) == ["a.rec"]  # no temporary file left
    assert remote.listing(f"file://{root}/d") == {"a.rec": 3000}
    out = io.BytesIO()
    remote.download(str(root / "d" / "a.rec"), out, size=3000)
    assert out.getvalue() == b"abc" * 1000


def test_missing_credentials_fail_fast_and_clearly(s3_server, no_aws):
    os.environ["AWS_ENDPOINT_URL"] = s3_server.endpoint
    remote = Remote("s3://some-bucket", retries=5, backoff=1.0)
    started = time.monotonic()
    with pytest.raises(PermissionError, match="credentials") as info:
        remote.download("s3://some-bucket/a.rec", io.BytesIO(), size=10, what="shard 0")
    assert time.monotonic() - started < 2.0
    assert "s3://some-bucket/a.rec" in str(info.value) and "shard 0" in str(info.value)
    del os.environ["AWS_ENDPOINT_URL"]


class _Redirector(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self):  # noqa: N802
        self.send_response(302)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


class _Target(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802
        type(self).hits.append(self.path)
        body = b"you should not be here"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture
def redirecting_server(no_aws):
    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Target)
    _Target.hits = []
    _Redirector.target = f"http://127.0.0.1:{target.server_address[1]}"
    redirector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirector)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (target, redirector)]
    for t in threads:
        t.start()
    yield f"http://127.0.0.1:{redirector.server_address[1]}"
    for s in (target, redirector):
        s.shutdown()
        s.server_close()
    for t in threads:
        t.join()


def test_an_http_redirect_is_refused_naming_the_url(redirecting_server):
    url = f"{redirecting_server}/sets/train.stoker.json?sig=SECRETSIG"
    remote = Remote(redirecting_server, retries=3, backoff=0.5)
    started = time.monotonic()
    with pytest.raises(StorageError, match="302") as info:
        remote.download(url, io.BytesIO(), size=22, what="the manifest")
    msg = str(info.value)
    assert f"{redirecting_server}/sets/train.stoker.json" in msg and "SECRETSIG" not in msg
    assert "redirect" in msg and "the manifest" in msg
    with pytest.raises(StorageError, match="redirect"):
        remote.size(url)
    assert _Target.hits == []  # the other server never saw a request
    assert time.monotonic() - started < 2.0  # refused at once, not retried


def test_retry_delays_are_full_jitter_under_a_doubling_cap():
    import random

    from stoker.storage.retry import RetryPolicy

    policy = RetryPolicy(retries=5, backoff=0.2, cap=1.0)
    rng = random.Random(0)
    for n, ceiling in enumerate([0.2, 0.4, 0.8, 1.0, 1.0, 1.0]):
        draws = [policy.delay(n, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in draws)
        assert max(draws) > 0.8 * ceiling and min(draws) < 0.2 * ceiling  # spread, not fixed
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)


def test_classify_sorts_faults_through_the_cause_chain():
    from stoker.storage.retry import ShortReadError, classify

    class ClientError(Exception):  # the shape of botocore's, without importing it
        def __init__(self, status: int, code: str):
            super().__init__(code)
            self.response = {
                "Error": {"Code": code},
                "ResponseMetadata": {"HTTPStatusCode": status},
            }

    def wrapped(cause: BaseException, outer: BaseException) -> BaseException:
        outer.__cause__ = cause
        return outer

    assert classify(ConnectionResetError()) == "transient"
    assert classify(TimeoutError()) == "transient"
    assert classify(ShortReadError("short")) == "transient"
    assert classify(wrapped(ClientError(503, "SlowDown"), OSError(16, "x"))) == "transient"
    assert classify(wrapped(ClientError(500, "InternalError"), OSError())) == "transient"
    assert classify(wrapped(ClientError(404, "NoSuchKey"), FileNotFoundError())) == "missing"
    assert classify(wrapped(ClientError(403, "AccessDenied"), PermissionError())) == "denied"
    assert classify(type("NoCredentialsError", (Exception,), {})()) == "denied"
    # fsspec's HTTP backend calls a failed HEAD "not found"; the cause decides
    assert classify(wrapped(ClientError(503, "x"), FileNotFoundError("u"))) == "transient"
    assert classify(ValueError("bad argument")) == "permanent"


@pytest.fixture
def plain_http_server(no_aws, tmp_path):
    """A stdlib file server on loopback: it ignores Range and always sends the whole file."""
    import functools

    handler = functools.partial(_QuietFiles, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_http_download_from_a_server_without_range_support(plain_http_server, tmp_path):
    data = os.urandom(300_000)
    (tmp_path / "a.rec").write_bytes(data)
    remote = Remote(plain_http_server, chunk=64 * 1024)
    assert remote.size(f"{plain_http_server}/a.rec") == len(data)
    out = io.BytesIO()
    remote.download(f"{plain_http_server}/a.rec", out, size=len(data))
    assert out.getvalue() == data
    with pytest.raises(FileNotFoundError, match="a-missing.rec"):
        remote.download(f"{plain_http_server}/a-missing.rec", io.BytesIO(), size=3)
