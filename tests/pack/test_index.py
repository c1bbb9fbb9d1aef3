"""``stoker index`` over tars written by WebDataset's own ``TarWriter``: the collection reads as
WebDataset reads it, exactly once over ranks in every order, resumes exactly, refuses a tar
changed since it was indexed, names a sample it cannot index, and resumes a killed index."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from collections import Counter

import braceexpand
import numpy as np
import pytest
import simplejpeg
import webdataset

import stoker
from set_writers import jpegs
from stoker._core.errors import CorruptRecordError, ManifestError
from stoker.cli import main
from stoker.formats import open_reader
from stoker.pack.index import expand, index_collection

TARS, PER = 20, 3


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> str:
    """20 tars of 3 samples (a JPEG, a .cls and a caption each) and their folder."""
    root = str(tmp_path_factory.mktemp("collection"))
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (TARS * PER, 24, 24, 3), dtype=np.uint8)
    blobs = [simplejpeg.encode_jpeg(p, quality=90) for p in pixels]  # one size: no transforms
    labels = rng.integers(0, 4, TARS * PER).tolist()
    for t in range(TARS):
        with webdataset.TarWriter(os.path.join(root, f"shards-{t:06d}.tar")) as w:
            for k in range(t * PER, (t + 1) * PER):
                w.write({"__key__": f"s{k:05d}", "jpg": blobs[k], "cls": labels[k], "txt": f"c{k}"})
    return root


def _pattern(root: str) -> str:
    return os.path.join(root, "shards-{000000..000019}.tar")


@pytest.fixture(scope="module")
def indexed(collection) -> str:
    out = os.path.join(collection, "coll.stoker.json")
    assert main(["index", _pattern(collection), out, "--quiet", "--workers", "3"]) == 0
    return out


@pytest.mark.parametrize(
    "pattern",
    ["a-{000..012}.tar", "x{1..3}y{a,b}", "{8..11}", "plain.tar", "p-{0009..0011}.tar"],
)
def test_patterns_expand_as_braceexpand_does(pattern):
    assert expand(pattern) == list(braceexpand.braceexpand(pattern))


def test_the_collection_reads_as_webdataset_reads_it(collection, indexed):
    theirs: Counter = Counter()
    for tar in expand(_pattern(collection)):  # WebDataset's own expander and grouping
        with open(tar, "rb") as f:
            stream = webdataset.tariterators.tar_file_expander([{"url": tar, "stream": f}])
            for s in webdataset.tariterators.group_by_keys(stream):
                theirs[(s["__key__"], s["jpg"], int(s["cls"]), s["txt"].decode())] += 1
    with open_reader(indexed) as r:
        f = r.reader(None, ("txt",))
        ours = Counter(
            (r.key_name(i), bytes(f(i)[0]), int(f(i)[1]), f(i)[3]["txt"]) for i in range(len(r))
        )
        assert r.schema.stored["txt"].kind == "text"
    assert ours == theirs and len(ours) == TARS * PER
    with open(indexed, encoding="utf-8") as f:
        m = json.load(f)
    assert all(s["files"]["index"].endswith(".stkwds") for s in m["shards"])
    assert len(json.dumps(m)) < 400 * TARS  # keys and offsets live in the side-cars


@pytest.mark.parametrize("order", [False, True, "shards"])
def test_two_ranks_read_every_sample_exactly_once(indexed, order):
    seen = []
    for rank in range(2):
        kw = dict(batch_size=4, shuffle=order, seed=3, workers=2 if rank else 0)
        with stoker.Loader(indexed, rank=rank, world_size=2, drop_last=False, **kw) as ld:
            seen += [int(i) for b in ld for i in b.indices]
    # ranks pad to the same step count: every sample at least once, repeats only as padding
    assert set(seen) == set(range(TARS * PER)) and len(seen) - TARS * PER < 2 * 4


def test_a_run_resumes_exactly(indexed):
    kw = dict(batch_size=5, shuffle=True, seed=11, workers=2)
    with stoker.Loader(indexed, **kw) as ld:
        whole = [b.indices.copy() for b in ld]
    with stoker.Loader(indexed, **kw) as ld:
        it = iter(ld)
        first = [next(it).indices.copy() for _ in range(4)]
        state = ld.state_dict()
    with stoker.Loader(indexed, **kw) as ld:
        ld.load_state_dict(state)
        rest = [b.indices.copy() for b in ld]
    assert len(first + rest) == len(whole)
    for a, b in zip(first + rest, whole, strict=True):
        np.testing.assert_array_equal(a, b)


def test_check_resume_passes(indexed, capsys):
    argv = ["check-resume", indexed, "--batch-size", "8", "--workers", "0", "--kills", "1"]
    assert main([*argv, "--epochs", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["passed"] is True


def _copy(collection: str, dest) -> str:
    os.makedirs(dest)
    for n in sorted(os.listdir(collection)):
        if n.endswith(".tar"):
            with open(os.path.join(collection, n), "rb") as src:
                (dest / n).write_bytes(src.read())
    return str(dest)


def test_a_tar_changed_since_indexing_is_refused_naming_stoker_index(collection, tmp_path):
    root = _copy(collection, tmp_path / "c")
    out = os.path.join(root, "c.stoker.json")
    index_collection(_pattern(root), out, progress=False)
    with open(os.path.join(root, "shards-000007.tar"), "ab") as f:
        f.write(bytes(10240))  # one more record of zeros: same samples, another size
    with pytest.raises(ManifestError, match="shards-000007.tar .*run `stoker index` again"):
        stoker.Loader(out, batch_size=4)


def test_a_sample_without_an_image_stops_the_index_naming_it(tmp_path):
    with webdataset.TarWriter(str(tmp_path / "bad-000.tar")) as w:
        w.write({"__key__": "fine", "jpg": jpegs(1, seed=1, classes=1, h0=8, w0=8, hmod=1)[0][0]})
        w.write({"__key__": "no-image", "txt": "a caption alone"})
    with pytest.raises(CorruptRecordError, match="bad-000.tar.*'no-image' has no image member"):
        index_collection(str(tmp_path / "bad-{000..000}.tar"), str(tmp_path / "b.stoker.json"))
    assert not (tmp_path / "b.stoker.json").exists()


def test_a_stopped_index_resumes_with_the_tars_it_had_not_finished(collection, tmp_path):
    root = _copy(collection, tmp_path / "c")
    victim = os.path.join(root, "shards-000011.tar")
    with open(victim, "rb") as f:
        good = f.read()
    with open(victim, "r+b") as f:
        f.seek(148)  # the first header's checksum field
        f.write(b"99999")
    out = os.path.join(root, "c.stoker.json")
    with pytest.raises(CorruptRecordError, match="shards-000011.tar"):
        index_collection(_pattern(root), out, workers=1, progress=False)
    with open(victim, "wb") as f:
        f.write(good)
    sides = sorted(glob.glob(os.path.join(root, "*.stkwds")))
    assert len(sides) == TARS - 1  # every other tar's index was stored before the error
    before = {p: os.stat(p).st_mtime_ns for p in sides}
    time.sleep(0.01)
    m = index_collection(_pattern(root), out, workers=2, progress=False)
    assert {p: os.stat(p).st_mtime_ns for p in sides} == before  # not indexed again
    assert os.path.exists(victim.removesuffix(".tar") + ".stkwds")
    assert m["records"] == TARS * PER


def test_the_loader_given_a_pattern_says_to_index_it(collection):
    with pytest.raises(ValueError, match=r"pattern of tar shards.*stoker index"):
        stoker.Loader(_pattern(collection), batch_size=4)


def test_verify_checks_each_tar_against_its_index(collection, tmp_path, capsys):
    root = _copy(collection, tmp_path / "c")
    out = os.path.join(root, "c.stoker.json")
    index_collection(_pattern(root), out, progress=False)
    assert main(["verify", out]) == 0
    side = os.path.join(root, "shards-000004.stkwds")
    os.replace(os.path.join(root, "shards-000005.stkwds"), side)  # another tar's index
    assert main(["verify", out]) != 0
    assert "shards-000004.stkwds" in capsys.readouterr().out


#: Ray keeps sockets open in a process after ``shutdown``: the driver runs in its own.
ON_RAY = """
import sys
from stoker.pack.index import index_collection
index_collection(sys.argv[1], sys.argv[2], engine="ray", workers=2, progress=False)
"""


@pytest.mark.interop
@pytest.mark.timeout(300)
def test_ray_tasks_write_the_index_the_threads_write(collection, tmp_path):
    here, there = _copy(collection, tmp_path / "a"), _copy(collection, tmp_path / "b")
    index_collection(_pattern(here), os.path.join(here, "c.stoker.json"), progress=False)
    env = dict(os.environ, STOKER_CACHE_DIR=str(tmp_path / "cache"))
    argv = [sys.executable, "-c", ON_RAY, _pattern(there), os.path.join(there, "c.stoker.json")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in sorted(os.listdir(here)):
        with open(os.path.join(here, name), "rb") as a, open(os.path.join(there, name), "rb") as b:
            assert a.read() == b.read(), name


@pytest.mark.parametrize("role", ["data", "index"])
@pytest.mark.parametrize(
    "name",
    [
        "https://other.example.com/shards-000001.tar",
        "s3://another-bucket/shards-000001.tar",
        "http://169.254.169.254/latest/meta-data",
        "/etc/passwd",
        "file:///etc/passwd",
        "../elsewhere/shards-000001.tar",
    ],
)
def test_an_index_that_points_at_another_host_or_folder_is_refused(indexed, role, name):
    """An index names its tars and side-cars relative to its own folder: an entry naming another
    host, a metadata address, an absolute path or a way out is refused at open, naming the
    shard, before anything is read from it."""
    with open(indexed) as f:
        m = json.load(f)
    m["shards"][1]["files"][role] = name
    hostile = os.path.join(os.path.dirname(indexed), f"hostile-{role}.stoker.json")
    with open(hostile, "w") as f:
        json.dump(m, f)
    try:
        with pytest.raises(ManifestError, match=r"shards\[1\]\.files\." + role):
            stoker.Loader(hostile, batch_size=4, workers=0)
    finally:
        os.remove(hostile)
