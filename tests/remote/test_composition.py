"""Every format in every place in every order: the same images and labels written as RecordIO,
TFRecord and WebDataset shards (each through its registry writer, same shard boundaries), as
tars written by ``webdataset.TarWriter`` and indexed by ``stoker index``, and as an LMDB
database, read from local disk, from ``s3://`` (moto's server on loopback) and from
``http://`` (``python -m http.server``), with ``shuffle=False``, ``True`` and ``"shards"``, 0 and
2 workers, 1 and 2 ranks (the loader's ``rank``/``world_size``, every rank of a run sharing one
shard cache), give the batches of the local RecordIO set (images after seeded augmentation,
labels, keys, positions) for the same seed.

LMDB is read from local disk only (a remote database is refused: see test_remote_formats.py)
and has no shards, so ``shuffle="shards"`` over it is refused at open with the way out.

The default run takes a pairwise sample of the matrix (every pair of values of any two axes
appears in some cell); ``-m slow`` runs every cell.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest

import stoker
from set_writers import jpegs, pairwise, write_set
from stoker.formats.protowire import LEN, VARINT, encode_field
from stoker.storage.remote import Remote, close_filesystems
from storage_doubles import StaticServer, upload_tree

N, SHARD, CLASSES, BATCH, SEED = 30, 4, 4, 5, 7
FORMATS = ("recordio", "tfrecord", "wds", "indexed", "lmdb")
PLACES = ("local", "s3", "http")
ORDERS = (False, True, "shards")
WORKERS = (0, 2)
RANKS = (1, 2)

pytestmark = pytest.mark.timeout(300)


def _valid(cell: tuple) -> bool:
    return cell[0] != "lmdb" or cell[1] == "local"


ALL = [c for c in itertools.product(FORMATS, PLACES, ORDERS, WORKERS, RANKS) if _valid(c)]


SAMPLE = pairwise(ALL)


def _cell_id(c: tuple) -> str:
    return f"{c[0]}-{c[1]}-shuffle={c[2]}-w{c[3]}-r{c[4]}"


CELLS = [
    pytest.param(*c, id=_cell_id(c), marks=() if c in SAMPLE else pytest.mark.slow) for c in ALL
]


def _write_lmdb(path: str, blobs: list[bytes], labels: list[int]) -> None:
    """Caffe ``Datum`` values holding the encoded image and its label, in position order."""
    import lmdb

    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, (jpeg, label) in enumerate(zip(blobs, labels, strict=True)):
            datum = b"".join(
                [
                    encode_field(1, VARINT, 3),
                    encode_field(4, LEN, jpeg),
                    encode_field(5, VARINT, label),
                    encode_field(7, VARINT, 1),
                ]
            )
            txn.put(f"{i:08d}".encode(), datum)
    env.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("composition"))
    blobs, labels = jpegs(N, seed=28, classes=CLASSES, h0=40, w0=44, hmod=4)
    for name in ("recordio", "tfrecord", "wds"):
        write_set(
            name, os.path.join(root, name, "set"), blobs, labels, shard=SHARD, classes=CLASSES
        )
    _write_lmdb(os.path.join(root, "lmdb"), blobs, labels)
    _write_indexed(os.path.join(root, "indexed"), blobs, labels)
    return root


def _write_indexed(folder: str, blobs: list[bytes], labels: list[int]) -> None:
    """Tars of ``SHARD`` samples written by WebDataset's own writer, indexed in place."""
    import webdataset

    from stoker.pack.index import index_collection

    os.makedirs(folder)
    for j, start in enumerate(range(0, len(blobs), SHARD)):
        with webdataset.TarWriter(os.path.join(folder, f"part-{j:03d}.tar")) as w:
            for k in range(start, min(start + SHARD, len(blobs))):
                w.write({"__key__": f"k{k:04d}", "jpg": blobs[k], "cls": labels[k]})
    last = (len(blobs) - 1) // SHARD
    pattern = os.path.join(folder, f"part-{{000..{last:03d}}}.tar")
    index_collection(pattern, os.path.join(folder, "set.stoker.json"), progress=False)


@pytest.fixture(scope="module")
def s3_sets(s3_server, folder, tmp_path_factory):
    """The three shard sets in one bucket of the session's S3 server, the AWS variables set
    for it (and nothing from the developer's own environment) while the module runs."""
    mp = pytest.MonkeyPatch()
    for name in list(os.environ):
        if name.startswith("AWS_"):
            mp.delenv(name)
    none = str(tmp_path_factory.mktemp("no-aws") / "none")
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", none)
    mp.setenv("AWS_CONFIG_FILE", none)
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for k, v in s3_server.env().items():
        mp.setenv(k, v)
    bucket = "composition-sets"
    r = Remote(f"s3://{bucket}")
    r.fs().mkdir(bucket)
    for name in ("recordio", "tfrecord", "wds", "indexed"):
        upload_tree(os.path.join(folder, name), f"s3://{bucket}/{name}")
    close_filesystems()
    yield f"s3://{bucket}"
    mp.undo()


@pytest.fixture(scope="module")
def http_sets(folder, s3_server):
    """``python -m http.server`` serving the sets' folder on loopback while the module runs
    (after the S3 server, so that fsspec's I/O thread is there before any test's leak check)."""
    with StaticServer(folder) as server:
        yield server.url


@pytest.fixture
def places(folder, s3_sets, http_sets, storage_closed):
    """Where each set lives, by place."""
    return {"local": folder, "s3": s3_sets, "http": http_sets}


TRANSFORMS = stoker.transforms.Compose(
    [
        stoker.transforms.Resize(36, shorter_side=True),
        stoker.transforms.RandomCrop(32),
        stoker.transforms.HorizontalFlip(),
    ]
)


def _source(fmt: str, base: str) -> str:
    if fmt == "lmdb":
        return os.path.join(base, "lmdb")
    sep = "/" if "://" in base else os.sep
    return sep.join([base, fmt, "set.stoker.json"])


def _batches(source: str, order: object, workers: int, rank: int, world: int, **kw) -> list:
    args = dict(batch_size=BATCH, transforms=TRANSFORMS, seed=SEED, shuffle=order, timeout=60)
    with stoker.Loader(source, workers=workers, rank=rank, world_size=world, **args, **kw) as ld:
        return [(b.images.copy(), b.labels.copy(), b.keys.copy(), b.indices.copy()) for b in ld]


_WANT: dict[tuple, list] = {}


def _want(folder: str, order: object, rank: int, world: int) -> list:
    """The local RecordIO set's batches for this rank (the same for any worker count)."""
    key = (order, rank, world)
    if key not in _WANT:
        _WANT[key] = _batches(_source("recordio", folder), order, 0, rank, world)
    return _WANT[key]


@pytest.mark.parametrize("fmt, place, order, workers, ranks", CELLS)
def test_every_cell_gives_the_local_recordio_batches(
    places, tmp_path, fmt, place, order, workers, ranks
):
    source = _source(fmt, places[place])
    kw = {} if place == "local" else {"cache_dir": str(tmp_path / "shard-cache")}
    if fmt == "lmdb" and order == "shards":
        with pytest.raises(ValueError, match='shuffle="shards" needs a set made of shards'):
            stoker.Loader(source, batch_size=BATCH, transforms=TRANSFORMS, shuffle=order)
        return
    steps = set()
    for rank in range(ranks):
        want = _want(places["local"], order, rank, ranks)
        got = _batches(source, order, workers, rank, ranks, **kw)
        assert len(got) == len(want) > 0
        for b, (g, w) in enumerate(zip(got, want, strict=True)):
            for part, what in enumerate(("images", "labels", "keys", "indices")):
                assert g[part].dtype == w[part].dtype, (rank, b, what)
                np.testing.assert_array_equal(g[part], w[part], err_msg=f"rank {rank} batch {b}")
        steps.add(len(got))
    assert len(steps) == 1  # every rank takes the same number of steps
