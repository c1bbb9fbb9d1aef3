"""One loader, every format: the same JPEGs and labels written as RecordIO, TFRecord and
WebDataset shards (each through its writer in the registry) and as LMDB databases (with the
``lmdb`` package, in both layouts) load through ``stoker.Loader`` into identical batches (images,
labels, keys and order) for the same seed and transforms, with workers 0 and 2."""

from __future__ import annotations

import os

import numpy as np
import pytest
import simplejpeg

import stoker
from stoker._core.schema import Schema
from stoker.formats import registry
from stoker.formats.protowire import LEN, VARINT, encode_field
from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize

N, SHARD, CLASSES = 30, 12, 4
WRITTEN = ("recordio", "tfrecord", "wds")
TRANSFORMS = Compose([Resize(40, shorter_side=True), RandomCrop(32), HorizontalFlip()])


def _samples() -> tuple[list[bytes], list[int]]:
    rng = np.random.default_rng(16)
    blobs, labels = [], []
    for i in range(N):
        h, w = 44 + 4 * (i % 5), 48 + 6 * (i % 3)
        base = rng.integers(0, 256, (h // 4 + 1, w // 4 + 1, 3), dtype=np.uint8)
        img = np.ascontiguousarray(np.repeat(np.repeat(base, 4, 0), 4, 1)[:h, :w])
        blobs.append(simplejpeg.encode_jpeg(img, quality=90))
        labels.append(int(rng.integers(0, CLASSES)))
    return blobs, labels


def _write_set(name: str, folder: str, blobs: list[bytes], labels: list[int]) -> str:
    """The set in format ``name`` through the registry's writer and manifest, in shards."""
    fmt = registry.get(name)
    open_writer, write_manifest = fmt.load("writer"), fmt.load("manifest")
    prefix = os.path.join(folder, name)
    schema = Schema.classification((), "int64")
    entries = []
    for j, start in enumerate(range(0, N, SHARD)):
        w = open_writer(prefix, j, schema=schema, checksums=True)
        for k in range(start, min(start + SHARD, N)):
            w.write(k, blobs[k], labels[k], {})
        entries.append(w.commit())
    manifest = prefix + ".stoker.json"
    classes = {f"c{c}": c for c in range(CLASSES)}
    write_manifest(manifest, entries, classes=classes, schema=schema, pack=None, rejects=None)
    return manifest


def _datum(jpeg: bytes, label: int) -> bytes:
    """A Caffe ``Datum`` holding the encoded image (``encoded: true``) and its label."""
    return b"".join(
        [
            encode_field(1, VARINT, 3),  # channels
            encode_field(4, LEN, jpeg),  # data: the encoded bytes
            encode_field(5, VARINT, label),
            encode_field(7, VARINT, 1),  # encoded
        ]
    )


def _write_lmdb(path: str, values: list[bytes]) -> None:
    import lmdb

    env = lmdb.open(path, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i, v in enumerate(values):
            txn.put(f"{i:08d}".encode(), v)  # LMDB's byte order is the position order
    env.close()


@pytest.fixture(scope="module")
def sets(tmp_path_factory) -> dict[str, object]:
    folder = str(tmp_path_factory.mktemp("formats"))
    blobs, labels = _samples()
    out: dict[str, object] = {name: _write_set(name, folder, blobs, labels) for name in WRITTEN}
    datum = os.path.join(folder, "caffe")
    _write_lmdb(datum, [_datum(b, lab) for b, lab in zip(blobs, labels)])
    out["lmdb-datum"] = datum
    lsun = os.path.join(folder, "lsun")
    _write_lmdb(lsun, blobs)
    out["lmdb-image"] = (lsun, {f"{i:08d}": lab for i, lab in enumerate(labels)})
    out["truth"] = (blobs, labels)
    return out


def _load(source: object, workers: int, engine: str | None = None) -> list[tuple[np.ndarray, ...]]:
    if isinstance(source, tuple):  # LSUN-style: the labels come from a key list
        source = stoker.formats.open(source[0], format="lmdb", layout="image", labels=source[1])
    kw = dict(
        batch_size=7, transforms=TRANSFORMS, shuffle=True, seed=5, workers=workers, engine=engine
    )
    with stoker.Loader(source, **kw) as ld:  # type: ignore[arg-type]
        return [(b.images.copy(), b.labels.copy(), b.keys.copy(), b.indices.copy()) for b in ld]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_format_gives_the_same_batches(sets, workers):
    blobs, labels = sets["truth"]  # type: ignore[misc]
    want = _load(sets["recordio"], workers)
    order = np.concatenate([b[3] for b in want])
    assert sorted(order.tolist()) == list(range(N))
    assert np.concatenate([b[1] for b in want]).tolist() == [labels[i] for i in order]
    assert np.concatenate([b[2] for b in want]).tolist() == order.tolist()
    for name in ("tfrecord", "wds", "lmdb-datum", "lmdb-image"):
        got = _load(sets[name], workers)
        assert len(got) == len(want) == -(-N // 7), name
        for b, (g, w) in enumerate(zip(got, want)):
            for part, what in enumerate(("images", "labels", "keys", "indices")):
                assert g[part].dtype == w[part].dtype, (name, b, what)
                np.testing.assert_array_equal(g[part], w[part], err_msg=f"{name} {what} {b}")


@pytest.mark.slow
@pytest.mark.parametrize("name", [*WRITTEN, "lmdb-datum", "lmdb-image"])
def test_every_format_crosses_to_spawned_workers(sets, name):
    """The portable engine's workers get each format's reader pickled as its configuration
    and reopen it: the Linux engine's batches."""
    want = _load(sets[name], 2, engine="linux")
    got = _load(sets[name], 2, engine="portable")
    assert len(got) == len(want) == -(-N // 7)
    for g, w in zip(got, want):
        for part in range(4):
            np.testing.assert_array_equal(g[part], w[part])


def test_every_format_reads_the_stored_bytes_and_labels(sets):
    blobs, labels = sets["truth"]  # type: ignore[misc]
    for name in (*WRITTEN, "lmdb-datum", "lmdb-image"):
        src = sets[name]
        opts = {}
        if isinstance(src, tuple):
            src, opts = src[0], {"layout": "image", "labels": src[1]}
        with registry.open_reader(src, **opts) as r:  # type: ignore[arg-type]
            assert len(r) == N and r.labels().tolist() == labels, name
            get = r.reader(np.arange(N), ())
            assert [bytes(get(i)[0]) for i in range(N)] == blobs, name
