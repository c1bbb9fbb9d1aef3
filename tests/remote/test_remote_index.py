"""``stoker index`` over tars in a bucket (written by WebDataset's own ``TarWriter``, on the
loopback S3 server): the index is written beside them from their brace pattern, the loader
reads the collection in place exactly once over two ranks with the samples WebDataset reads,
and a tar changed on the server since it was indexed is refused naming ``stoker index``. (Every
order, place and rank count against the other formats: test_composition.py's ``indexed``.)"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
import simplejpeg
import webdataset

import stoker
from stoker._core.errors import ManifestError
from stoker.cli import main
from stoker.formats import open_reader
from stoker.storage.remote import Remote
from storage_doubles import upload_tree

pytestmark = pytest.mark.timeout(120)
TARS, PER = 6, 4


@pytest.fixture
def bucket_collection(s3env, tmp_path, cache_dir):
    """The tars in the bucket (their local copies' folder, the pattern) and the index made of
    them by the command line, written beside them in the bucket."""
    local = tmp_path / "tars"
    local.mkdir()
    rng = np.random.default_rng(2)
    for t in range(TARS):
        with webdataset.TarWriter(str(local / f"part-{t:03d}.tar")) as w:
            for k in range(t * PER, (t + 1) * PER):
                img = simplejpeg.encode_jpeg(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
                w.write({"__key__": f"k{k:04d}", "jpg": img, "cls": k % 3})
    upload_tree(str(local), f"s3://{s3env}/coll")
    pattern = f"s3://{s3env}/coll/part-{{000..{TARS - 1:03d}}}.tar"
    out = f"s3://{s3env}/coll/coll.stoker.json"
    assert main(["index", pattern, out, "--quiet", "--cache-dir", cache_dir]) == 0
    return str(local), out


def _webdataset_samples(folder: str) -> Counter:
    out: Counter = Counter()
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            stream = webdataset.tariterators.tar_file_expander([{"url": name, "stream": f}])
            for s in webdataset.tariterators.group_by_keys(stream):
                out[(s["__key__"], s["jpg"], int(s["cls"]))] += 1
    return out


def test_an_indexed_bucket_reads_in_place_exactly_once(bucket_collection, cache_dir):
    local, url = bucket_collection
    _reads_as_webdataset_exactly_once(url, local, TARS * PER, cache_dir=cache_dir)


def _reads_as_webdataset_exactly_once(url: str, local: str, n: int, **kw) -> None:
    """The indexed collection at ``url`` has the samples WebDataset reads from the tars in
    ``local``, and two ranks (0 and 2 workers) read each of its ``n`` once."""
    with open_reader(url, **kw) as r:
        f = r.reader()
        ours = Counter((r.key_name(i), bytes(f(i)[0]), int(f(i)[1])) for i in range(len(r)))
    assert ours == _webdataset_samples(local)
    seen = []
    for rank in range(2):
        opts = dict(batch_size=4, shuffle=True, seed=1, workers=rank * 2, **kw)
        with stoker.Loader(url, rank=rank, world_size=2, **opts) as ld:
            seen += [int(i) for b in ld for i in b.indices]
    assert sorted(seen) == list(range(n))


def test_a_tar_changed_in_the_bucket_is_refused(bucket_collection, tmp_path):
    local, url = bucket_collection
    victim = os.path.join(local, "part-002.tar")
    with open(victim, "r+b") as f:  # one byte of a JPEG's data: the same size, other bytes
        f.seek(512 + 100)
        b = f.read(1)
        f.seek(512 + 100)
        f.write(bytes([b[0] ^ 0xFF]))
    Remote(url).upload(victim, url.rsplit("/", 1)[0] + "/part-002.tar")
    with pytest.raises(Exception, match=r"sha256.*run `stoker index` again") as e:
        with stoker.Loader(url, batch_size=4, shuffle=False, cache_dir=str(tmp_path / "c")) as ld:
            for _ in ld:
                pass
    assert "part-002.tar" in str(e.value), str(e.value)


@pytest.fixture
def cdn(tmp_path):
    """The collection's tars on a plain HTTP server nobody may write to (a CDN), with their
    local folder and brace pattern."""
    import fsspec.asyn

    from stoker.storage.remote import close_filesystems
    from storage_doubles import StaticServer

    fsspec.asyn.get_loop()  # fsspec's I/O thread lives as long as the process
    local = tmp_path / "cdn"
    local.mkdir()
    rng = np.random.default_rng(5)
    for t in range(3):
        with webdataset.TarWriter(str(local / f"p-{t}.tar")) as w:
            for k in range(t * PER, (t + 1) * PER):
                img = simplejpeg.encode_jpeg(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))
                w.write({"__key__": f"k{k:04d}", "jpg": img, "cls": k % 3})
    with StaticServer(local) as server:
        try:
            yield str(local), server.url + "/p-{0..2}.tar"
        finally:
            close_filesystems()


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_tars_on_another_host_are_read_in_place_only_from_allowed_hosts(
    cdn, where, s3env, tmp_path, cache_dir
):
    """An index of tars on a host the user cannot write (a CDN) is written elsewhere, on local
    disk or in the user's bucket, with the side-cars beside it; it opens only with that host
    allowed, then reads WebDataset's samples exactly once over two ranks and verifies, and a
    tar replaced on the host since is refused naming `stoker index`."""
    local, pattern = cdn
    host = pattern.split("/")[2]
    out = (
        str(tmp_path / "idx" / "c.stoker.json")
        if where == "local"
        else f"s3://{s3env}/i/c.stoker.json"
    )
    assert main(["index", pattern, out, "--quiet", "--cache-dir", cache_dir]) == 0
    for allowed in ([], ["127.0.0.1:1"], ["169.254.169.254"]):
        with pytest.raises(ManifestError, match=rf"files\.data.*allow_hosts=\['{host}'\]"):
            stoker.Loader(out, batch_size=4, cache_dir=cache_dir, allow_hosts=allowed)
    _reads_as_webdataset_exactly_once(out, local, 3 * PER, cache_dir=cache_dir, allow_hosts=[host])
    assert main(["verify", out, "--quiet", "--cache-dir", cache_dir, "--allow-host", host]) == 0
    with open(os.path.join(local, "p-1.tar"), "ab") as f:
        f.write(bytes(512))  # the tar replaced by a longer one
    with pytest.raises(ManifestError, match=r"p-1\.tar.*run `stoker index` again"):
        stoker.Loader(out, batch_size=4, cache_dir=str(tmp_path / "c2"), allow_hosts=[host])
