"""A set on a plain static HTTP server (``python -m http.server``: an HTML folder index without
sizes, no Range support) reads as the same set on local disk; what such a server refuses is
named as HTTP, not as a storage credential."""

from __future__ import annotations

import http.server
import os
import threading

import numpy as np
import pytest

import stoker
from stoker.storage.remote import close_filesystems
from storage_doubles import StaticServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="session")
def fsspec_loop() -> None:
    """fsspec's I/O thread lives as long as the process (its self-pipe is a socket pair): it
    starts before any test's leak check takes its snapshot."""
    import fsspec.asyn

    fsspec.asyn.get_loop()


@pytest.fixture
def http_root(packed, fsspec_loop):
    """``python -m http.server`` serving the packed set's parent folder on loopback."""
    with StaticServer(os.path.dirname(packed)) as server:
        try:
            yield f"{server.url}/{os.path.basename(packed)}"
        finally:
            close_filesystems()


def _batches(ld) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    with ld:
        return [(b.images.copy(), np.asarray(b.labels).copy(), b.keys.copy()) for b in ld]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_set_on_a_plain_http_server_gives_the_local_batches(packed, http_root, tmp_path, workers):
    kw = dict(batch_size=8, seed=3, shuffle="shards", workers=workers, timeout=60)
    want = _batches(stoker.Loader(os.path.join(packed, "train.stoker.json"), **kw))
    url = f"{http_root}/train.stoker.json"
    got = _batches(stoker.Loader(url, cache_dir=str(tmp_path / "cache"), **kw))
    assert len(got) == len(want) > 0
    for (xa, ya, ka), (xb, yb, kb) in zip(got, want, strict=True):
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)


def test_a_missing_shard_on_http_is_named_at_open(packed, http_root, tmp_path):
    gone = os.path.join(packed, "train-00003.idx")
    os.rename(gone, gone + ".away")
    try:
        with pytest.raises(FileNotFoundError, match="train-00003.idx"):
            stoker.Loader(f"{http_root}/train.stoker.json", batch_size=4, workers=0,
                          cache_dir=str(tmp_path / "cache"))  # fmt: skip
    finally:
        os.rename(gone + ".away", gone)


def test_a_global_shuffle_over_http_that_cannot_fit_is_refused_before_any_download(
    tmp_path, fsspec_loop
):
    stoker.make_sample_data(tmp_path / "images", classes=2, per_class=16, size=32, workers=1)
    out = tmp_path / "set"
    stoker.pack(tmp_path / "images", out / "train", shard_size=4, workers=1, progress=False,
                format="tfrecord")  # fmt: skip
    shards = [p.stat().st_size for p in out.glob("*.tfrecord")]
    cache = tmp_path / "cache"
    with StaticServer(str(out)) as server:
        try:
            with pytest.raises(stoker.CacheFullError) as e:
                stoker.Loader(f"{server.url}/train.stoker.json", batch_size=4, shuffle=True,
                              workers=0, cache_dir=str(cache), cache_limit=5 * max(shards))  # fmt: skip
        finally:
            close_filesystems()
    text = str(e.value)
    assert "read with shuffle=True needs" in text and "KiB" in text and " bytes" not in text
    assert "must hold the whole set" in text and 'shuffle="shards"' in text
    held = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    assert held < min(shards)  # the manifest only: no shard was downloaded


class _Forbidding(http.server.SimpleHTTPRequestHandler):
    """A static server that refuses everything with 403, as a CDN does without a token."""

    def send_head(self):  # type: ignore[override]
        self.send_error(403, "Forbidden")
        return None

    def log_message(self, *args: object) -> None:
        pass


def test_a_403_from_an_http_server_names_http_not_aws_credentials(tmp_path, fsspec_loop):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidding)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/sets/train.stoker.json"
        with pytest.raises(PermissionError) as e:
            stoker.Loader(url, batch_size=4, workers=0, cache_dir=str(tmp_path / "cache"))
        text = str(e.value)
        assert url in text and "HTTP server refused" in text
        assert "AWS" not in text
    finally:
        close_filesystems()
        server.shutdown()
        server.server_close()


def test_http_without_its_client_library_names_the_extra(monkeypatch):
    import builtins

    from stoker.storage.remote import Remote

    real = builtins.__import__

    def no_aiohttp(name, *args, **kwargs):
        if name == "aiohttp" or name.startswith("aiohttp."):
            raise ModuleNotFoundError("No module named 'aiohttp'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_aiohttp)
    with pytest.raises(ImportError, match=r'pip install "stoker\[remote\]"'):
        Remote("http://127.0.0.1:9/x").fs()
