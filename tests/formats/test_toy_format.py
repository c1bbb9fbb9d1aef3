"""A format defined outside stoker (``toyfmt.py``: a Shard and a FORMAT, nothing under src)
reads as the built-in formats do: the composition test's cells over local disk, ``http://``
and the loopback S3 server, ``shuffle=False``, ``True`` and ``"shards"``, 0 and 2 workers, 1
and 2 ranks give the batches of the same images packed as RecordIO (for ``"shards"``: read in
the toy's blocks); shard-aware order keeps a window inside few of its blocks; and
``stoker verify`` and ``stoker check-resume`` take it once a ``stoker.formats`` entry point
names its module. The default run takes a pairwise sample of the matrix; ``-m slow`` runs every cell.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import stoker
from set_writers import jpegs, pairwise, write_set
from stoker.formats.spec import FORMATS
from stoker.sampling import ShardOrder
from stoker.storage.remote import Remote, close_filesystems
from storage_doubles import StaticServer, upload_tree

N, SHARD, BLOCK, CLASSES, BATCH, SEED = 30, 8, 4, 4, 5, 7
TRANSFORMS = stoker.transforms.Compose(
    [stoker.transforms.Resize(36, shorter_side=True), stoker.transforms.RandomCrop(32)]
)
ALL = list(itertools.product(("local", "s3", "http"), (False, True, "shards"), (0, 2), (1, 2)))
SAMPLE = pairwise(ALL)
CELLS = [
    pytest.param(*c, id="-".join(map(str, c)), marks=() if c in SAMPLE else pytest.mark.slow)
    for c in ALL
]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def toyfmt():
    """The toy format, registered while the module runs (its import registers it)."""
    import toyfmt

    yield toyfmt
    FORMATS.pop("toy")
    sys.modules.pop("toyfmt")


@pytest.fixture(scope="module")
def folder(toyfmt, tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("toy"))
    blobs, labels = jpegs(N, seed=28, classes=CLASSES, h0=40, w0=44, hmod=4)
    os.makedirs(os.path.join(root, "toy"))
    toyfmt.write_set(os.path.join(root, "toy", "set"), blobs, labels, SHARD, BLOCK, CLASSES)
    rec = os.path.join(root, "recordio", "set")
    write_set("recordio", rec, blobs, labels, shard=SHARD, classes=CLASSES)
    return root


@pytest.fixture(scope="module")
def s3_set(s3_server, folder, tmp_path_factory):
    """The toy set in a bucket of the session's S3 server, its AWS variables set (and none of
    the developer's own) while the module runs."""
    mp = pytest.MonkeyPatch()
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        mp.delenv(name)
    none = str(tmp_path_factory.mktemp("no-aws") / "none")
    for name, value in {"AWS_SHARED_CREDENTIALS_FILE": none, "AWS_CONFIG_FILE": none,
                        "AWS_EC2_METADATA_DISABLED": "true", **s3_server.env()}.items():  # fmt: skip
        mp.setenv(name, value)
    Remote("s3://toy-sets").fs().mkdir("toy-sets")
    upload_tree(os.path.join(folder, "toy"), "s3://toy-sets/toy")
    close_filesystems()
    yield "s3://toy-sets/toy/set.stoker.json"
    mp.undo()


@pytest.fixture(scope="module")
def http_set(folder, s3_server):
    """``python -m http.server`` over the sets' folder (started after the S3 server, so that
    fsspec's I/O thread is there before any test's leak check)."""
    with StaticServer(folder) as server:
        yield server.url + "/toy/set.stoker.json"


def _batches(source: str, workers: int, **kw) -> list:
    args = dict(batch_size=BATCH, transforms=TRANSFORMS, seed=SEED, workers=workers, timeout=60)
    with stoker.Loader(source, **args, **kw) as ld:
        return [(b.images.copy(), b.labels.copy(), b.keys.copy(), b.indices.copy()) for b in ld]


def _want(folder: str, order: object, rank: int, world: int) -> list:
    """The RecordIO set's batches; for ``"shards"`` its ShardOrder windowed by the toy's
    blocks (shards of 8 in blocks of 4)."""
    rec = os.path.join(folder, "recordio", "set.stoker.json")
    where = {"rank": rank, "world_size": world}
    if order != "shards":
        return _batches(rec, 0, shuffle=order, **where)
    sizes = [min(SHARD, N - s) for s in range(0, N, SHARD)]
    blocks = [min(BLOCK, n - b) for n in sizes for b in range(0, n, BLOCK)]
    return _batches(rec, 0, sampler=ShardOrder(sizes, blocks=blocks, seed=SEED, **where))


@pytest.mark.parametrize("place, order, workers, ranks", CELLS)
def test_every_cell_gives_the_recordio_batches(
    folder, s3_set, http_set, storage_closed, tmp_path, place, order, workers, ranks
):
    source = {"local": os.path.join(folder, "toy", "set.stoker.json"), "s3": s3_set}
    source["http"] = http_set
    kw = {} if place == "local" else {"cache_dir": str(tmp_path / "shard-cache")}
    steps = set()
    for rank in range(ranks):
        want = _want(folder, order, rank, ranks)
        got = _batches(source[place], workers, shuffle=order, rank=rank, world_size=ranks, **kw)
        assert len(got) == len(want) > 0
        for b, (g, w) in enumerate(zip(got, want, strict=True)):
            for part in range(4):  # images, labels, keys, indices
                assert g[part].dtype == w[part].dtype
                np.testing.assert_array_equal(g[part], w[part], err_msg=f"rank {rank} batch {b}")
        steps.add(len(got))
    assert len(steps) == 1  # every rank takes the same number of steps


def test_shard_order_reads_few_blocks_at_a_time(folder):
    """The reader gives its shards' blocks; the loader's shard order then has at most 4 (its
    window) begun and unfinished at any point, where windows of whole shards would mix all
    8; the cache's plan still counts file shards."""
    source = os.path.join(folder, "toy", "set.stoker.json")
    with stoker.formats.open(source) as r:
        assert r.shard_sizes().tolist() == [8, 8, 8, 6]
        assert r.block_sizes().tolist() == [4, 4, 4, 4, 4, 4, 4, 2]
    with stoker.Loader(source, batch_size=BATCH, transforms=TRANSFORMS, shuffle="shards") as ld:
        delivered = np.concatenate([b.indices.copy() for b in ld])
        orders = [ld.sampler.indices(epoch) for epoch in range(3)]
    np.testing.assert_array_equal(delivered, orders[0])
    for order in orders:
        assert sorted(order.tolist()) == list(range(N))
        block = (order // BLOCK).tolist()
        last = {k: i for i, k in enumerate(block)}
        assert max(len({k for k in block[: i + 1] if last[k] >= i}) for i in range(N)) <= 4


def test_a_format_without_blocks_opens_no_shard_for_them(tmp_path):
    """WebDataset's plan declares no blocks: its shards stay unopened (a remote set's
    undownloaded) and shard order windows whole shards."""
    blobs, labels = jpegs(12, seed=3, classes=2, h0=32, w0=32, hmod=2)
    source = write_set("wds", str(tmp_path / "set"), blobs, labels, shard=4, classes=2)
    with stoker.formats.open(source) as r:
        assert r.block_sizes() is None
        assert r._shards == [None, None, None]


def _plugin_env(formats: str) -> dict[str, str]:
    """The environment of a process in which an installed package declares each module of
    ``formats`` (comma-separated) a ``stoker.formats`` entry point, as ``pip install`` of a
    format's package leaves it: a ``.dist-info`` folder on the path (``toyfmt`` is importable
    from here)."""
    site = tempfile.mkdtemp(prefix="toy-plugin-")
    info = os.path.join(site, "toyplugin-0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: toyplugin\nVersion: 0\n")
    names = [m.strip() for m in formats.split(",") if m.strip()]
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write("[stoker.formats]\n" + "".join(f"f{k} = {m}\n" for k, m in enumerate(names)))
    path = [site, os.path.dirname(__file__), *filter(None, [os.environ.get("PYTHONPATH")])]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def _cli(*args: str, formats: str = "toyfmt") -> subprocess.CompletedProcess:
    """``python -m stoker.cli ARGS`` where an installed package declares ``formats``."""
    env = _plugin_env(formats)
    cmd = [sys.executable, "-m", "stoker.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


def test_stoker_verify_walks_it_and_names_a_broken_block(folder, tmp_path):
    source = os.path.join(folder, "toy", "set.stoker.json")
    out = _cli("verify", source, "--json", formats="")
    assert out.returncode != 0 and "kind 'toy' is not a format stoker reads" in out.stderr
    out = _cli("verify", source, "--json", formats="toyfmt, no_such_format_module")
    assert out.returncode != 0 and "names 'no_such_format_module', which does not" in out.stderr
    out = _cli("verify", source, "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0 and report["ok"] and report["format"] == "toy"
    assert report["records"] == report["checksummed"] == N
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in pathlib.Path(folder, "toy").iterdir():
        name, data = f.name, bytearray(f.read_bytes())
        if name.endswith("00001.toy"):
            second = 4 + 8 + int.from_bytes(data[8:12], "little")  # the second block's offset
            data[second + 20] ^= 0xFF  # inside its zlib stream
        (broken / name).write_bytes(data)
    out = _cli("verify", str(broken / "set.stoker.json"), "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 1 and report["problem_count"] >= 2, report
    assert any(p["offset"] == second and "00001.toy" in p["path"] for p in report["problems"])
    assert any("checksum mismatch" in p["reason"] for p in report["problems"])


def test_stoker_check_resume_resumes_it_exactly_on_two_ranks(folder):
    source = os.path.join(folder, "toy", "set.stoker.json")
    args = ["--shuffle", "shards", "--world-size", "2", "--kills", "1", "--epochs", "1"]
    args += ["--batch-size", "4", "--transforms", "seed000-uint8", "--workers", "0", "--json"]
    out = _cli("check-resume", source, *args)
    report = json.loads(out.stdout or "{}")
    assert out.returncode == 0 and report["passed"] is True, out.stderr[-2000:]
    assert len(report["kills"]) == 1


RANK = """
import json, sys
import torch.distributed as dist
import stoker
rank, init, source, out = int(sys.argv[1]), *sys.argv[2:]
dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
try:
    kw = dict(batch_size=5, transforms=stoker.transforms.RandomCrop(32), seed=7, workers=2)
    with stoker.Loader(source, shuffle="shards", **kw) as ld:  # rank, world size: from gloo
        with open(out, "w") as f:
            json.dump([b.indices.tolist() for b in ld], f)
finally:
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.dist
def test_two_gloo_ranks_read_it_in_shard_order(folder, tmp_path):
    """Two real torch.distributed (gloo) processes, each a loader with 2 workers that import
    the format themselves: each rank's order is the one ``rank=``/``world_size=`` give."""
    pytest.importorskip("torch")
    source = os.path.join(folder, "toy", "set.stoker.json")
    env = _plugin_env("toyfmt")
    args = [str(tmp_path / "init"), source]
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK, str(r), *args, str(tmp_path / f"{r}.json")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(2)
    ]  # fmt: skip
    try:
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r}:\n{outputs[r]}"
        got = json.loads((tmp_path / f"{r}.json").read_text())
        want = _batches(source, 0, shuffle="shards", rank=r, world_size=2)
        assert got == [w[3].tolist() for w in want]
