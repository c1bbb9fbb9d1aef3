"""TFRecord and WebDataset sets in object storage read in place with RecordIO's guarantees: the
cache's budget holds at every instant and the room a run needs is claimed at open, a shard
replaced on the server is named at open, a corrupt byte is caught before it is used, and each
shard is downloaded once per node for every rank. A remote LMDB is refused with the way out.
(That every format in every place gives the local batches: test_composition.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

import numpy as np
import pytest

import stoker
from stoker.storage.remote import Remote
from storage_doubles import upload_tree

pytestmark = pytest.mark.timeout(120)

#: The formats whose shards are whole files (a manifest entry's data file and its bytes).
FIELDS = ("tfrecord", "wds")


def _data(s: dict) -> str:
    return s["files"]["data"]


@pytest.fixture(scope="session")
def shard_sets(packed, tmp_path_factory) -> dict[str, str]:
    """The packed RecordIO set (15 shards of 4) converted to TFRecord and WebDataset shards of
    the same sizes: each format's folder."""
    out = {}
    for fmt in FIELDS:
        folder = tmp_path_factory.mktemp(fmt)
        stoker.convert(os.path.join(packed, "train.stoker.json"), folder / "train", format=fmt,
                       shard_size=4, workers=1, progress=False)  # fmt: skip
        out[fmt] = str(folder)
    return out


def _upload(folder: str, bucket: str, prefix: str) -> str:
    upload_tree(folder, f"s3://{bucket}/{prefix}")
    return f"s3://{bucket}/{prefix}/train.stoker.json"


def _manifest(folder: str) -> dict:
    with open(os.path.join(folder, "train.stoker.json")) as f:
        return json.load(f)


def _batches(ld) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    with ld:
        return [(b.images.copy(), np.asarray(b.labels).copy(), b.keys.copy()) for b in ld]


def _same(a, b) -> None:
    assert len(a) == len(b) > 0
    for (xa, ya, ka), (xb, yb, kb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)


def _cache_bytes(root: str) -> int:
    total = 0
    for folder, _, names in os.walk(root):
        for n in names:
            try:
                total += os.stat(os.path.join(folder, n)).st_size
            except FileNotFoundError:
                pass
    return total


@pytest.mark.parametrize(
    "fmt", ["wds", pytest.param("tfrecord", marks=pytest.mark.slow)]
)  # fmt: skip
def test_a_cache_smaller_than_the_set_stays_within_its_budget(
    shard_sets, s3env, cache_dir, fmt
):  # fmt: skip
    folder = shard_sets[fmt]
    url = _upload(folder, s3env, fmt)
    m = _manifest(folder)
    sizes = [s["bytes"] for s in m["shards"]]
    limit = int(sum(sizes) * 0.49)  # under half the set: about seven of its 15 shards
    assert 6.5 * max(sizes) < limit < sum(sizes) / 2
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            used = sum(_cache_bytes(os.path.join(cache_dir, d)) for d in ("entries", "tmp"))
            peak[0] = max(peak[0], used)
            time.sleep(0.002)

    # two batches in flight read at most four shards (two windows of two), one downloads
    # ahead: five shards' room is claimed, of the about six that fit
    counts = np.array([s["records"] for s in m["shards"]])
    order = stoker.sampling.ShardOrder(counts, seed=4, window=2)
    kw = dict(batch_size=4, sampler=order, workers=2, prefetch=1, prefetch_shards=1)
    want = _batches(stoker.Loader(os.path.join(folder, "train.stoker.json"), **kw))
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        got = _batches(stoker.Loader(url, cache_dir=cache_dir, cache_limit=limit, **kw))
    finally:
        stop.set()
        t.join()
    _same(got, want)
    assert 0 < peak[0] <= limit


@pytest.mark.parametrize("fmt", ["wds", pytest.param("tfrecord", marks=pytest.mark.slow)])
def test_a_global_shuffle_over_a_cache_smaller_than_the_set_is_refused_at_open(
    shard_sets, s3env, cache_dir, fmt
):
    url = _upload(shard_sets[fmt], s3env, fmt)
    sizes = [s["bytes"] for s in _manifest(shard_sets[fmt])["shards"]]
    with pytest.raises(stoker.CacheFullError, match="must hold the whole set") as e:
        stoker.Loader(url, batch_size=4, shuffle=True, workers=0, cache_dir=cache_dir,
                      cache_limit=sum(sizes) // 2)  # fmt: skip
    assert url in str(e.value) and 'shuffle="shards"' in str(e.value)  # the way out


@pytest.mark.parametrize("fmt", ["tfrecord", pytest.param("wds", marks=pytest.mark.slow)])
def test_a_shard_replaced_on_the_server_is_named_at_open(shard_sets, s3env, cache_dir, fmt):
    folder = shard_sets[fmt]
    url = _upload(folder, s3env, fmt)
    name = _manifest(folder)["shards"][3]["files"]["data"]
    with open(os.path.join(folder, name), "rb") as f:
        short = f.read()[:-512]
    Remote(url).fs().pipe_file(f"{s3env}/{fmt}/{name}", short)
    with pytest.raises(stoker.ManifestError, match=f"{name} is {len(short)} bytes") as e:
        stoker.Loader(url, batch_size=4, workers=0, cache_dir=cache_dir)
    assert "bytes" not in str(e.value) or "shards[3]" in str(e.value)


def _flip_image_byte(folder: str, fmt: str, shard: int) -> tuple[str, bytes]:
    """Shard ``shard``'s bytes with one byte of its second sample's JPEG flipped (same size)."""
    name = _manifest(folder)["shards"][shard]["files"]["data"]
    with stoker.formats.open(os.path.join(folder, name)) as r:
        image = bytes(r.reader(np.arange(2), ())(1)[0])
    with open(os.path.join(folder, name), "rb") as f:
        data = bytearray(f.read())
    at = data.find(image) + len(image) // 2
    data[at] ^= 0xFF
    return name, bytes(data)


@pytest.mark.parametrize("fmt", sorted(FIELDS))
def test_a_corrupt_byte_in_a_shard_is_caught_before_it_is_used(shard_sets, s3env, cache_dir, fmt):
    folder = shard_sets[fmt]
    url = _upload(folder, s3env, fmt)
    name, bad = _flip_image_byte(folder, fmt, 2)
    Remote(url).fs().pipe_file(f"{s3env}/{fmt}/{name}", bad)
    ld = stoker.Loader(url, batch_size=4, shuffle=False, workers=0, cache_dir=cache_dir)
    # TFRecord: the record's data CRC, on read; WebDataset: the tar's sha256, on download
    expect = "CRC" if fmt == "tfrecord" else "sha256"
    with ld, pytest.raises(stoker.CorruptRecordError, match=expect) as e:
        for _ in ld:
            pass
    assert name in str(e.value)


@pytest.mark.parametrize("fmt", ["wds", pytest.param("tfrecord", marks=pytest.mark.slow)])
def test_verify_of_a_url_names_the_corrupt_shard_by_its_url(shard_sets, s3env, cache_dir, fmt):
    folder = shard_sets[fmt]
    url = _upload(folder, s3env, fmt)
    name, bad = _flip_image_byte(folder, fmt, 2)
    Remote(url).fs().pipe_file(f"{s3env}/{fmt}/{name}", bad)
    verify = stoker.formats.registry.get(fmt).load("verify")
    report = verify(url, remote=stoker.formats.remote.RemoteOptions(cache_dir=cache_dir))
    assert not report.ok and report.records == 60
    shard_url = f"s3://{s3env}/{fmt}/{name}"
    assert {p.path for p in report.problems} == {shard_url}
    reason = report.problems[0].reason
    assert ("data CRC" in reason) if fmt == "tfrecord" else ("sha256 differs" in reason)
    assert os.listdir(cache_dir) in ([], ["manifests"])  # its downloads are gone


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


@pytest.mark.slow  # by default: test_a_tfrecord_set_is_scanned_once_per_node
@pytest.mark.parametrize("fmt", sorted(FIELDS))
def test_two_ranks_of_two_workers_download_each_shard_once_per_node(
    shard_sets, s3env, cache_dir, proxy, fmt
):
    url = _upload(shard_sets[fmt], s3env, fmt)
    env = dict(os.environ, AWS_ENDPOINT_URL=proxy.endpoint)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, url, cache_dir, str(rank)],
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
    shards = _manifest(shard_sets[fmt])["shards"]
    gets = Counter(r[1].rsplit("/", 1)[-1].split("?")[0] for r in proxy.requests if r[0] == "GET")
    for s in shards:
        assert gets[_data(s)] == 1, gets  # each shard downloaded once by the node
    got = sorted(k for out, _ in outs for k in json.loads(out))
    assert got == list(range(60))  # 60 records over 2 ranks, each once


@pytest.mark.parametrize(
    "url", ["s3://bucket/sets/train_lmdb", "s3://bucket/db/data.mdb", "https://host/x.lmdb"]
)
def test_a_remote_lmdb_is_refused_with_the_way_out(url, tmp_path):
    with pytest.raises(ValueError, match="stoker convert") as e:
        stoker.Loader(url, batch_size=4, workers=0, cache_dir=str(tmp_path))
    assert "not fetched whole" in str(e.value) and url in str(e.value)
    with pytest.raises(ValueError, match="not fetched whole"):
        stoker.formats.open("s3://bucket/sets/x.stoker.json", format="lmdb")


def test_a_tfrecord_set_is_scanned_once_per_node(shard_sets, s3env, tmp_path, proxy, monkeypatch):
    """The process that opens a TFRecord set downloads each shard once to index it; another
    process of the node (a rank, a worker, a later run; here a fresh shard cache) finds the
    index without downloading any shard."""
    url = _upload(shard_sets["tfrecord"], s3env, "tfrecord")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    names = [_data(s) for s in _manifest(shard_sets["tfrecord"])["shards"]]

    def shard_gets() -> int:
        got = [r[1] for r in proxy.requests if r[0] == "GET"]
        return sum(any(p.split("?")[0].endswith("/" + n) for n in names) for p in got)

    with stoker.formats.open(url, cache_dir=str(tmp_path / "a")) as r:
        labels = r.labels().copy()
    assert shard_gets() == len(names)
    proxy.clear()
    with stoker.formats.open(url, cache_dir=str(tmp_path / "b")) as r:
        np.testing.assert_array_equal(r.labels(), labels)
        assert len(r) == 60 and shard_gets() == 0
        r.reader(np.arange(1), ())(0)  # reading a record downloads its shard
        assert shard_gets() == 1


def _shard_bytes(folder: str, fmt: str) -> list[int]:
    """Each shard's bytes in the shard cache, its files' verification markers included."""
    from stoker.storage.cache import MARKER_RESERVE

    out = []
    for s in _manifest(folder)["shards"]:
        if fmt == "recordio":
            names = list(s["files"].values())
        else:
            names = [_data(s)]
        out.append(sum(os.path.getsize(os.path.join(folder, n)) + MARKER_RESERVE for n in names))
    return out


@pytest.mark.parametrize(
    "fmt",
    ["recordio", pytest.param("tfrecord", marks=pytest.mark.slow),
     pytest.param("wds", marks=pytest.mark.slow)],
)  # fmt: skip
def test_the_workers_of_a_loader_whose_cache_holds_the_set_claim_nothing_more(
    packed, shard_sets, s3env, cache_dir, fmt
):
    """A cache that holds the whole set (and a shard to spare) lets readers keep every shard
    pinned; the loader claims the whole set for them, and its workers add no claim of their
    own (which, on top of the loader's, would not fit)."""
    folder = packed if fmt == "recordio" else shard_sets[fmt]
    url = _upload(folder, s3env, fmt)
    sizes = _shard_bytes(folder, fmt)
    limit = sum(sizes) + 2 * max(sizes)
    kw = dict(batch_size=4, shuffle=False, workers=2, prefetch=1, prefetch_shards=1)
    want = _batches(stoker.Loader(os.path.join(folder, "train.stoker.json"), **kw))
    got = _batches(stoker.Loader(url, cache_dir=cache_dir, cache_limit=limit, **kw))
    _same(got, want)


def test_a_full_cache_while_the_loader_sizes_the_images_is_a_cache_full_error(
    shard_sets, s3env, cache_dir, tmp_path
):
    """The loader reads the first image's size at open: a shard cache with no room for that
    read is reported as the ``CacheFullError`` it is, not as a problem with the transforms."""
    url = _upload(shard_sets["wds"], s3env, "wds")
    sizes = [s["bytes"] for s in _manifest(shard_sets["wds"])["shards"]]
    with stoker.Loader(url, batch_size=4, workers=0, cache_dir=str(tmp_path / "roomy")):
        pass  # the shard index is cached: opening again reads no shard before the sizes
    with pytest.raises(stoker.CacheFullError, match="budget is") as e:
        stoker.Loader(url, batch_size=4, workers=0, cache_dir=cache_dir,
                      cache_limit=4 * max(sizes) + 100)  # fmt: skip
    assert "transforms" not in str(e.value)


def test_verify_of_a_url_downloads_each_shard_once(shard_sets, s3env, tmp_path, proxy, monkeypatch):
    """``stoker verify URL`` opens the set as the loader does (manifest, listing, sizes) and
    walks each shard from one fresh download: a TFRecord set's scan is not a second one."""
    from stoker.cli import main

    url = _upload(shard_sets["tfrecord"], s3env, "tfrecord-verify")
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    names = [_data(s) for s in _manifest(shard_sets["tfrecord"])["shards"]]
    assert main(["verify", url, "--cache-dir", str(tmp_path / "cache")]) == 0
    got = [r[1].split("?")[0] for r in proxy.requests if r[0] == "GET"]
    assert sorted(n for n in names for p in got if p.endswith("/" + n)) == sorted(names)
