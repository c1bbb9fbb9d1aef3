"""One run's claims on the node's shard cache (``docs/remote.md``, "How much cache a run
needs"): the ranks of a run, their loaders and the readers that open the set claim in one group,
which counts once; so ranks started together are never refused at open with a cache their run
fits in, and a run that does not fit is refused at open, naming the budget, whichever rank opens
first.

Each cell reads a set of 9 shards of 7 records (RecordIO, TFRecord or WebDataset, on the
loopback S3 server) with 1-4 ranks in one process (the ranks' loaders opened one after another:
every later rank opens while the earlier ones hold their claims), each order, and a cache of
0.5-1.5x the set. A cell fits when the claims the run makes with an unbounded cache, counted as
the docs say, and the room a reader needs at open fit the budget. The default run takes
six cells; ``-m slow`` runs every cell.
"""

from __future__ import annotations

import glob
import itertools
import json
import multiprocessing as mp
import os
import socket

import pytest

import stoker
from set_writers import jpegs, write_set
from stoker._core.errors import CacheFullError
from stoker.loader._order import read_plan
from stoker.storage.cache import MARKER_RESERVE
from stoker.storage.remote import Remote, close_filesystems
from storage_doubles import upload_tree

N, SHARD, CLASSES, BATCH, SEED = 63, 7, 3, 4, 11
FORMATS = ("recordio", "tfrecord", "wds")
RANKS = (1, 2, 3, 4)
ORDERS = (False, True, "shards")
CACHE = (0.5, 0.8, 1.0, 1.2, 1.5)

pytestmark = pytest.mark.timeout(300)
CROP = stoker.transforms.RandomCrop(32)


ALL = list(itertools.product(FORMATS, RANKS, ORDERS, CACHE))
# every format, order and cache twice, every rank count at least once
SAMPLE = [
    ("recordio", 1, False, 0.5),
    ("tfrecord", 2, True, 1.0),
    ("wds", 3, "shards", 1.5),
    ("recordio", 4, "shards", 1.0),
    ("tfrecord", 3, False, 1.5),
    ("wds", 2, True, 0.5),
]
CELLS = [
    pytest.param(*c, id="-".join(map(str, c)), marks=() if c in SAMPLE else pytest.mark.slow)
    for c in ALL
]


@pytest.fixture(scope="module")
def sets(tmp_path_factory, s3_server):
    """The set in each format, locally and in a bucket of the session's S3 server."""
    root = str(tmp_path_factory.mktemp("claims"))
    blobs, labels = jpegs(N, seed=5, classes=CLASSES, h0=40, w0=44, hmod=4)
    mp_ = pytest.MonkeyPatch()
    for name in list(os.environ):
        if name.startswith("AWS_"):
            mp_.delenv(name)
    mp_.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for k, v in s3_server.env().items():
        mp_.setenv(k, v)
    Remote("s3://claim-sets").fs().mkdir("claim-sets")
    out = {}
    for name in FORMATS:
        local = write_set(
            name, os.path.join(root, name, "set"), blobs, labels, shard=SHARD, classes=CLASSES
        )
        upload_tree(os.path.join(root, name), f"s3://claim-sets/{name}")
        files = [f for f in glob.glob(os.path.join(root, name, "*")) if not f.endswith(".json")]
        whole = sum(os.path.getsize(f) + MARKER_RESERVE for f in files)
        out[name] = (local, f"s3://claim-sets/{name}/set.stoker.json", whole)
    close_filesystems()
    yield out
    mp_.undo()


def _open(url: str, world: int, order, cache: str, limit: int | None, ranks=None) -> list:
    kw = dict(
        batch_size=BATCH, seed=SEED, shuffle=order, workers=0, cache_dir=cache, transforms=CROP
    )
    loaders = []
    try:
        for r in ranks if ranks is not None else range(world):
            loaders.append(stoker.Loader(url, rank=r, world_size=world, cache_limit=limit, **kw))
    except BaseException:
        for ld in loaders:
            ld.close()
        raise
    return loaders


def _counted(cache: str) -> int:
    """The bytes the live claims in ``cache`` pin at once, as ``docs/remote.md`` counts them:
    per group, the largest shared claim plus every other claim, at most the group's cap."""
    claims = []
    for path in glob.glob(os.path.join(cache, "claims", "*.json")):
        with open(path) as f:
            claims.append(json.load(f))
    alone = sum(c["bytes"] for c in claims if c.get("group") is None)
    for g in {c["group"] for c in claims} - {None}:
        mine = [c for c in claims if c["group"] == g]
        top = sorted(c["bytes"] for c in mine if c["shared"])[-1:]
        cap = min(c["cap"] for c in mine)
        alone += min(sum(top) + sum(c["bytes"] for c in mine if not c["shared"]), cap)
    return alone


def _keys(loaders: list) -> list[list[int]]:
    out = []
    for ld in loaders:
        with ld:
            out.append([int(k) for b in ld for k in b.keys])
    return out


def _shard_bytes(local: str) -> list[int]:
    """Each shard's bytes in the cache: its files (data and side files) and their markers."""
    out: dict[str, int] = {}
    for f in glob.glob(os.path.join(os.path.dirname(local), "set-*")):
        j = os.path.basename(f).split(".")[0]
        out[j] = out.get(j, 0) + os.path.getsize(f) + MARKER_RESERVE
    return [out[j] for j in sorted(out)]


def _rule(local: str, world: int, order, limit: int) -> bool:
    """Whether the run fits ``limit`` by the rule ``docs/remote.md`` gives, worked out from
    each rank's read plan: a reader's room at open, and the run's group of claims."""
    sizes = _shard_bytes(local)
    whole, big, ahead = sum(sizes), max(sizes), 2
    if min((ahead + 2) * big, whole) > limit:
        return False
    shared, own = 0, 0
    for ld in _open(local, world, order, "unused", None):
        with ld:
            plan = read_plan(
                ld.sampler,
                ld._source.shard_sizes(),
                shuffle=order,
                per_batch=BATCH,
                prefetch=ld.prefetch,
                workers=0,
            )
        if plan.span is None or plan.span + ahead >= len(sizes):
            shared = max(shared, whole)
        elif plan.shared:
            shared = max(shared, min((plan.span + ahead) * big, whole))
        else:
            own += min((plan.span + ahead) * big, whole)
    return min(shared + own, whole) <= limit


@pytest.mark.parametrize(("fmt", "world", "order", "scale"), CELLS)
def test_a_run_opens_exactly_when_its_claims_fit(sets, tmp_path, fmt, world, order, scale):
    local, url, whole = sets[fmt]
    limit = int(whole * scale)
    fits = _rule(local, world, order, limit)
    assert fits or scale < 1.0  # a cache that holds the set always fits
    want = _keys(_open(local, world, order, str(tmp_path / "local"), None))
    for ranks in (list(range(world)), list(reversed(range(world)))):
        cache = str(tmp_path / f"c{ranks[0]}")
        try:
            loaders = dict(zip(ranks, _open(url, world, order, cache, limit, ranks=ranks)))
        except CacheFullError as e:
            assert not fits, f"refused a run that fits {limit} bytes: {e}"
            assert "budget" in str(e)
            continue
        assert fits, f"opened a run that does not fit {limit} bytes"
        assert _counted(cache) <= limit
        assert _keys([loaders[r] for r in range(world)]) == want


def _rank(rank: int, url: str, cache: str, limit: int, port: int, env: dict, steps, out) -> None:
    """One rank of a two-rank run (``MASTER_ADDR``/``MASTER_PORT`` as torchrun sets them):
    rank 1 opens the set and holds a shard (an open-time claim) until rank 0's loader has
    claimed, then opens its own loader; each sends the keys it reads."""
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    from stoker.formats import open_reader
    from stoker.formats.remote import RemoteOptions

    kw = dict(batch_size=BATCH, seed=SEED, shuffle=False, workers=2, transforms=CROP)
    try:
        if rank == 1:
            opts = RemoteOptions(cache_dir=cache, cache_limit=limit, loader=True)
            with open_reader(url, remote=opts) as reader:
                reader.read(0)  # holds shard 0: a claim made while opening the set
                steps[0].set()
                steps[1].wait(60)
        else:
            steps[0].wait(60)
        ld = stoker.Loader(url, rank=rank, world_size=2, cache_dir=cache, cache_limit=limit, **kw)
        if rank == 0:
            steps[1].set()
        with ld:
            out.put((rank, [int(k) for b in ld for k in b.keys]))
    except Exception as e:  # noqa: BLE001 - reported to the test
        steps[1].set()
        out.put((rank, f"{type(e).__name__}: {e}"))


def test_ranks_started_together_open_in_a_cache_their_run_fits(sets, tmp_path):
    local, url, whole = sets["recordio"]
    want = _keys(_open(local, 2, False, str(tmp_path / "local"), None))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    steps, out = (ctx.Event(), ctx.Event()), ctx.Queue()
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    cache = str(tmp_path / "cache")
    args = (url, cache, whole, port, env, steps, out)
    procs = [ctx.Process(target=_rank, args=(r, *args)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert got == {0: want[0], 1: want[1]}
