"""One loader, every format: the same JPEGs and labels written as RecordIO, TFRecord and
WebDataset shards (each through its writer in the registry) and as LMDB databases (with the
``lmdb`` package, in both layouts) load through ``stoker.Loader`` into identical batches (images,
labels, keys and order) for the same seed and transforms, with workers 0 and 2; and every kind of
reader (each format, raw Datums, an image folder, arrays) keeps the one read contract."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

import stoker
from set_writers import jpegs, write_set
from stoker._core.errors import SpecError
from stoker.codecs import decode
from stoker.formats import Reader, registry
from stoker.formats.base import is_encoded
from stoker.formats.protowire import LEN, VARINT, encode_field
from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize

N, SHARD, CLASSES = 30, 12, 4
WRITTEN = ("recordio", "tfrecord", "wds")
TRANSFORMS = Compose([Resize(40, shorter_side=True), RandomCrop(32), HorizontalFlip()])


def _samples() -> tuple[list[bytes], list[int]]:
    return jpegs(N, seed=16, classes=CLASSES, h0=44, w0=48, hmod=5)


def _write_set(name: str, folder: str, blobs: list[bytes], labels: list[int]) -> str:
    """The set in format ``name`` through the registry's writer and manifest, in shards."""
    prefix = os.path.join(folder, name)
    return write_set(name, prefix, blobs, labels, shard=SHARD, classes=CLASSES)


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


def _raw_datum(rgb: np.ndarray, label: int) -> bytes:
    """A raw Caffe ``Datum``: the pixels as Caffe stores them (CHW, BGR) and the label."""
    h, w, c = rgb.shape
    chw = np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))
    return b"".join(
        [
            encode_field(1, VARINT, c),
            encode_field(2, VARINT, h),
            encode_field(3, VARINT, w),
            encode_field(4, LEN, chw.tobytes()),
            encode_field(5, VARINT, label),
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
    raw = os.path.join(folder, "raw")
    _write_lmdb(raw, [_raw_datum(decode(b), lab) for b, lab in zip(blobs, labels)])
    out["lmdb-raw"] = raw
    images = os.path.join(folder, "images")
    for i, (b, lab) in enumerate(zip(blobs, labels)):
        os.makedirs(os.path.join(images, f"c{lab}"), exist_ok=True)
        with open(os.path.join(images, f"c{lab}", f"{i:03d}.jpg"), "wb") as f:
            f.write(b)
    out["folder"] = images
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


KINDS = [*WRITTEN, "lmdb-datum", "lmdb-raw", "lmdb-image", "folder", "arrays"]


def _reader(sets: dict[str, object], kind: str) -> Reader:
    """A reader of each kind over the same samples (arrays: the decoded images cut to one
    size)."""
    from stoker.loader import ArraySource, FolderSource

    if kind == "folder":
        return FolderSource(sets["folder"])  # type: ignore[arg-type]
    if kind == "arrays":
        blobs, labels = sets["truth"]  # type: ignore[misc]
        return ArraySource(np.stack([decode(b)[:44, :48] for b in blobs]), np.asarray(labels))
    src, opts = sets[kind], {}
    if isinstance(src, tuple):
        src, opts = src[0], {"layout": "image", "labels": src[1]}
    return registry.open_reader(src, **opts)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_every_reader_kind_keeps_the_one_read_contract(sets, kind):
    """What the loader asks of a reader, checked the same way for each format, raw Datums (a
    reader of decoded arrays, per sample), an image folder and arrays."""
    r = _reader(sets, kind)
    try:
        assert isinstance(r, Reader) and isinstance(r, stoker.formats.Reader)
        n, keys, labels = len(r), r.keys(), r.labels()
        assert n == N and keys.dtype == np.int64 and keys.shape == (n,) and len(labels) == n
        assert (r.label_spec.shape, r.label_spec.dtype) == (labels.shape[1:], labels.dtype.name)
        assert r.schema.header_name is not None and r.schema.stored == {}
        sizes = r.image_sizes()
        assert sizes.shape == (n, 2) and sizes.dtype == np.int32
        get = r.reader(np.arange(n), ())
        decoded = []
        for i in range(n):
            image, label, key, fields = get(i)
            assert key == keys[i] == r.key(i) and fields == {} and str(key) in r.describe(i)
            np.testing.assert_array_equal(label, labels[i])
            img = decode(image) if is_encoded(r.encoded, image) else image
            assert r.sample_spec.accepts(img) and img.shape[:2] == tuple(sizes[i])
            np.testing.assert_array_equal(decode(r.stored_bytes(image)), img)
            decoded.append(img)
        assert kind != "lmdb-raw" or all(isinstance(get(i)[0], np.ndarray) for i in range(n))
        image, label = r.read(3)
        np.testing.assert_array_equal(np.asarray(bytes(image)), np.asarray(bytes(get(3)[0])))
        with pytest.raises(SpecError):
            r.reader(np.arange(2), ("no_such_field",))(0)
        fp = r.fingerprint()
        json.dumps(fp)
        shards = r.shard_sizes()
        assert shards is None or int(shards.sum()) == n
        r.share()  # what the loader calls before workers start: then it pickles
        copy = pickle.loads(pickle.dumps(r))
        try:
            assert len(copy) == n and copy.fingerprint() == fp
            np.testing.assert_array_equal(copy.labels(), labels)
            first = copy.reader(np.arange(2), ())(1)[0]
            np.testing.assert_array_equal(decode(copy.stored_bytes(first)), decoded[1])
        finally:
            copy.close()
        with stoker.Loader(r, batch_size=8, transforms=Resize((24, 24)), workers=0) as ld:
            got = np.concatenate([b.labels.copy() for b in ld])
        np.testing.assert_array_equal(got, labels)
    finally:
        r.close()


def test_a_reader_without_reader_or_read_is_refused_naming_both():
    """A Reader subclass gives ``reader(indices, fields)`` or ``read(i)``; with neither, the
    first read names both, rather than recursing between the two defaults."""

    class Half(Reader):
        def __len__(self):
            return 2

        def keys(self):
            return np.arange(2, dtype=np.int64)

        def labels(self):
            return np.zeros(2, np.int64)

        def fingerprint(self):
            return {"type": "half"}

    for call in (lambda r: r.reader(), lambda r: r.read(0)):
        with pytest.raises(TypeError, match=r"reader\(indices, fields\) or read\(i\)"):
            call(Half())
