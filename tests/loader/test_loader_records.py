"""Loading packed RecordIO files: labels and keys from the records, images decoded as by
``stoker.codecs``, and a damaged record named by file, key and offset."""

from __future__ import annotations

import numpy as np
import pytest
from loader_helpers import jpeg_bytes

from stoker import CorruptRecordError, ImageDecodeError, WorkerError
from stoker.codecs import decode
from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.loader import Loader, RecordSource, Source
from stoker.transforms import CenterCrop, Compose, HorizontalFlip, Normalize, RandomCrop, Resize


def write_rec(path, n=24, size=(40, 48), keys=None, label_offset=0):
    rng = np.random.default_rng(1)
    imgs = [rng.integers(0, 256, (*size, 3), dtype=np.uint8) for _ in range(n)]
    payloads = [jpeg_bytes(im) for im in imgs]
    keys = list(range(100, 100 + n)) if keys is None else keys
    with RecordWriter(path) as w:
        for k, p, i in zip(keys, payloads, range(n)):
            w.write(k, pack_header(IRHeader(0, float(i % 4 + label_offset), k, 0), p))
    return payloads, keys


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("rec") / "train.rec")
    payloads, keys = write_rec(path)
    return path, payloads, keys


def test_rec_images_labels_keys(rec):
    path, payloads, keys = rec
    with Loader(path, batch_size=10, transforms=CenterCrop(32), workers=2) as ld:
        got = [(b.images.copy(), b.labels.copy(), b.keys.copy()) for b in ld]
    images = np.concatenate([g[0] for g in got])
    labels = np.concatenate([g[1] for g in got])
    np.testing.assert_array_equal(np.concatenate([g[2] for g in got]), keys)
    assert labels.dtype == np.int64
    np.testing.assert_array_equal(labels, np.arange(24) % 4)
    for i, p in enumerate(payloads):
        np.testing.assert_array_equal(images[i], decode(p)[4:36, 8:40])


@pytest.mark.parametrize("kind", ["fractional", "multi"])
def test_worker_labels_match_the_sources_labels(tmp_path, kind):
    # workers read each label from its record header; the batches must carry exactly the
    # labels (values and dtype) the source reports for the whole file
    path = str(tmp_path / "lab.rec")
    img = jpeg_bytes(np.full((16, 16, 3), 90, np.uint8))
    with RecordWriter(path) as w:
        for k in range(12):
            lab = k / 4 if kind == "fractional" else [k, 2 * k + 0.5, 7]
            w.write(k, pack_header(IRHeader(0, lab, k, 0), img))
    src = RecordSource(path)
    expected = src.labels()
    with Loader(
        path, batch_size=5, transforms=CenterCrop(8), workers=2, shuffle=True, seed=1
    ) as ld:
        got = [(b.labels.copy(), b.indices.copy()) for b in ld]
    labels = np.concatenate([g[0] for g in got])
    order = np.concatenate([g[1] for g in got])
    assert labels.dtype == expected.dtype == np.float32
    np.testing.assert_array_equal(labels, expected[order])


class _ToldSource(RecordSource):
    """Records the indices each chunk's reader is made with (workers=0: in this process)."""

    def __init__(self, path):
        super().__init__(path)
        self.told: list[list[int]] = []

    def reader(self, indices=None, fields=()):
        self.told.append([] if indices is None else list(map(int, indices)))
        return super().reader(indices, fields)


class _ReadOnlySource(Source):
    """A custom source that implements ``read`` but not ``reader``: the base class's
    ``reader(indices)`` serves it (the loader always passes a chunk's indices)."""

    def __init__(self, path):
        self.inner = RecordSource(path)

    def __len__(self):
        return len(self.inner)

    def key(self, i):
        return self.inner.key(i)

    def keys(self):
        return self.inner.keys()

    def labels(self):
        return self.inner.labels()

    def read(self, i):
        return self.inner.read(i)

    def fingerprint(self):
        return self.inner.fingerprint()


def test_each_chunks_reader_is_told_its_indices_and_a_source_without_one_works(rec):
    path, _, keys = rec
    told = _ToldSource(path)
    with Loader(
        told, batch_size=10, transforms=CenterCrop(32), shuffle=True, seed=3, workers=0
    ) as ld:
        told.told.clear()  # the construction's read of the first image's size
        order = [b.indices.tolist() for b in ld]
    assert told.told == order  # workers=0: one chunk per batch, told exactly its indices
    with Loader(path, batch_size=10, transforms=CenterCrop(32), workers=2) as ld:
        want = [(b.images.copy(), b.keys.copy()) for b in ld]
    with Loader(_ReadOnlySource(path), batch_size=10, transforms=CenterCrop(32), workers=2) as ld:
        got = [(b.images.copy(), b.keys.copy()) for b in ld]
    assert len(got) == len(want) == 3
    for (gi, gk), (wi, wk) in zip(got, want):
        np.testing.assert_array_equal(gi, wi)
        np.testing.assert_array_equal(gk, wk)
    assert np.concatenate([k for _, k in got]).tolist() == keys


def test_source_read_gives_the_labels_dtype_in_any_process(rec):
    # in the process that opened it and in a worker (unpickled), read() gives each label as
    # labels() does: int64 class ids here, whichever is called first
    import pickle

    path, _, _ = rec
    for src in (RecordSource(path), pickle.loads(pickle.dumps(RecordSource(path)))):
        labels = [src.read(i)[1] for i in range(6)]
        assert [np.asarray(v).dtype for v in labels] == [np.dtype(np.int64)] * 6
        assert [int(v) for v in labels] == [0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize("kind", ["int", "fractional", "multi"])
def test_source_reader_gives_what_read_and_key_give(tmp_path, kind):
    # reader() is the per-sample call of a worker (a fast path for one-label records): the
    # same bytes, label (value and dtype) and key as read() and key(), in the opening process
    # and in a worker, and the same error for a damaged record
    import pickle

    path = str(tmp_path / "r.rec")
    img = jpeg_bytes(np.full((16, 16, 3), 90, np.uint8))
    with RecordWriter(path) as w:
        for k in range(8):
            lab = {"int": k % 3, "fractional": k / 4, "multi": [k, 0.5]}[kind]
            w.write(50 + k, pack_header(IRHeader(0, lab, k, 0), img))
    opened = RecordSource(path)
    opened.labels()
    for src, told in ((opened, None), (pickle.loads(pickle.dumps(opened)), None)) + (
        (pickle.loads(pickle.dumps(opened)), np.array([6, 2, 2, 9])),  # noqa: S301
    ):
        get = src.reader(told)  # a worker tells it the chunk's indices
        for i in range(len(src)):
            payload, label, key, _ = get(i)
            want, want_label = src.read(i)
            assert bytes(payload) == bytes(want) and key == src.key(i) == 50 + i
            assert np.asarray(label).dtype == np.asarray(want_label).dtype == opened.labels().dtype
            np.testing.assert_array_equal(label, want_label)
        src.close()
    with RecordSource(path) as r:
        bad_at = r.locate(5)[1]
    sent = pickle.dumps(RecordSource(path))  # what a worker gets, before the damage
    with open(path, "r+b") as f:
        f.seek(bad_at)
        f.write(b"\x00" * 4)  # the record's magic
    worker = pickle.loads(sent)  # noqa: S301
    with pytest.raises(CorruptRecordError) as via_read:
        worker.read(5)
    with pytest.raises(CorruptRecordError) as via_reader:
        worker.reader()(5)
    assert str(via_reader.value) == str(via_read.value) and "key 55" in str(via_read.value)
    worker.close()


def test_rec_float_normalised_nchw_same_for_all_worker_counts(rec):
    path, _, _ = rec
    t = Compose([Resize(36), RandomCrop(32), HorizontalFlip(), Normalize()])
    outs = []
    for workers in (0, 2):
        with Loader(
            path, batch_size=8, transforms=t, workers=workers, layout="NCHW", seed=4, shuffle=True
        ) as ld:
            outs.append([b.images.copy() for b in ld])
            assert ld.output_spec.shape == (3, 32, 32) and ld.output_spec.dtype == "float32"
    for a, b in zip(*outs):
        assert a.dtype == np.float32 and a.shape[1:] == (3, 32, 32)
        np.testing.assert_array_equal(a, b)


def test_record_source_pickles_as_its_path(rec):
    import pickle

    path, _, _ = rec
    src = RecordSource(path)
    clone = pickle.loads(pickle.dumps(src))  # noqa: S301 - our own object, in memory
    assert len(pickle.dumps(src)) < 2000
    np.testing.assert_array_equal(clone.read(3)[0], src.read(3)[0])
    src.close()
    clone.close()


def test_corrupt_record_is_named_by_file_and_key(tmp_path):
    path = str(tmp_path / "bad.rec")
    payloads, keys = write_rec(path, n=6)
    rec = RecordSource(path)
    start = rec.locate(3)[1] + 8 + 24  # dmlc record header, then IRHeader: the JPEG of key 103
    rec.close()
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(b"\x00" * 64)
    with Loader(path, batch_size=6, transforms=CenterCrop(32), workers=1) as ld:
        with pytest.raises(ImageDecodeError, match=r"key 103") as info:
            next(iter(ld))
    assert isinstance(info.value, WorkerError) and info.value.key == 103
    assert "bad.rec" in str(info.value) and "byte offset" in str(info.value)


def test_truncated_rec_raises_corrupt_record_error(tmp_path):
    path = str(tmp_path / "cut.rec")
    write_rec(path, n=6)
    with open(path, "r+b") as f:
        f.truncate(f.seek(0, 2) - 500)
    try:
        ld = Loader(path, batch_size=6, transforms=CenterCrop(32), workers=1)
    except CorruptRecordError as e:  # the reader may refuse at open
        assert "cut.rec" in str(e)
        return
    with ld:
        with pytest.raises(CorruptRecordError, match=r"cut.rec.*key 105"):
            next(iter(ld))
