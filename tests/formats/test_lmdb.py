"""LMDB through the format seam: databases written by the real ``lmdb`` package in both layouts
(Caffe Datum, raw and encoded; LSUN-style key -> JPEG/WebP) open with ``stoker.formats.open``
and give the right images and labels, in this process, after pickling into a fresh process,
in a forked child, and from a read-only copy."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import pickle
import shutil
import sys

import numpy as np
import pytest
from test_lmdb_util import datum, encode, lsun_key, photo, raw_datum, write_db

import stoker.formats
from stoker._core.errors import SpecError
from stoker.codecs import decode
from stoker.formats.lmdb import LmdbFormatError, LmdbReader, encode_png, sniff


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def raw_db(tmp_path):
    """12 raw Datums of varied sizes, Caffe-style keys, labels i % 4."""
    images = [photo(i, 16 + i, 20 + 2 * i) for i in range(12)]
    items = [(f"{i:08d}_img{i}.jpg".encode(), raw_datum(im, i % 4)) for i, im in enumerate(images)]
    return write_db(tmp_path / "caffe_train_lmdb", items), images


@pytest.fixture
def lsun_db(tmp_path):
    """10 LSUN-style values, alternately JPEG and WebP, under sha1-like hex keys."""
    items = {}
    for i in range(10):
        items[lsun_key(i)] = encode(photo(100 + i), ".jpg" if i % 2 else ".webp")
    path = write_db(tmp_path / "bedroom_train_lmdb", list(items.items()))
    return path, dict(sorted(items.items()))  # LMDB order: keys sorted as bytes


def _all(r, **kw):
    f = r.reader(np.arange(len(r)), **kw)
    return [f(i) for i in range(len(r))]


def test_raw_datums_arrive_as_decoded_pixels_without_a_png(raw_db):
    """A raw Datum is handed over as its pixels (no PNG written or decoded on the way), the
    same pixels its lossless PNG decodes to; where bytes are needed that PNG is written."""
    path, images = raw_db
    with stoker.formats.open(path) as r:
        assert isinstance(r, LmdbReader) and r.format == "lmdb" and r.layout == "datum"
        assert r.encoded is None  # per sample: a Datum set may hold raw and encoded ones
        assert len(r) == 12
        np.testing.assert_array_equal(r.keys(), np.arange(12))
        assert r.labels().dtype == np.int64
        np.testing.assert_array_equal(r.labels(), np.arange(12) % 4)
        assert r.schema.header_name == "label"
        for i, (img, label, key, fields) in enumerate(_all(r)):
            assert isinstance(img, np.ndarray) and img.dtype == np.uint8
            assert img.flags.c_contiguous and img.shape == (*images[i].shape[:2], 3)
            # Caffe stores BGR; the loader gets RGB
            np.testing.assert_array_equal(img, images[i][:, :, ::-1])
            png = r.stored_bytes(img)
            assert bytes(png[:8]) == b"\x89PNG\r\n\x1a\n"
            np.testing.assert_array_equal(decode(png), img)
            assert (label, key, fields) == (i % 4, i, {})
        np.testing.assert_array_equal(
            r.image_sizes(), [im.shape[:2] for im in images]
        )  # from the arrays' shapes


def test_grey_and_bgra_datums_give_the_pixels_their_png_decodes_to(tmp_path):
    grey = photo(1)[:, :, 0]
    bgra = np.dstack([photo(2), np.arange(photo(2).size // 3, dtype=np.uint8).reshape(24, 32)])
    path = write_db(tmp_path / "db", [(b"a", raw_datum(grey, 1)), (b"b", raw_datum(bgra, 2))])
    with stoker.formats.open(path) as r:
        (g, gl, _, _), (c, cl, _, _) = _all(r)
        np.testing.assert_array_equal(g, np.dstack([grey] * 3))
        np.testing.assert_array_equal(c, bgra[:, :, 2::-1])  # alpha left out, as decode does
        assert (gl, cl) == (1, 2)
    for img, chw in ((grey, grey[None]), (bgra, bgra.transpose(2, 0, 1))):
        # the pixels the PNG a raw Datum was read as decodes to (grey and RGBA PNGs)
        png = encode_png(np.ascontiguousarray(chw).tobytes(), *chw.shape)
        np.testing.assert_array_equal(decode(png), g if img is grey else c)


def test_png_level_trades_time_for_size_with_the_same_pixels(raw_db):
    path, images = raw_db
    with stoker.formats.open(path) as fast, stoker.formats.open(path, png_level=9) as small:
        a, b = (r.stored_bytes(r.read(11)[0]) for r in (fast, small))
        assert len(b) < len(a)
        np.testing.assert_array_equal(decode(a), decode(b))
    with pytest.raises(ValueError, match="png_level"):
        stoker.formats.open(path, png_level=10)


def test_encoded_datums_give_their_stored_bytes_untouched(tmp_path):
    jpegs = [encode(photo(i), ".jpg") for i in range(6)]
    items = [
        (f"{i:08d}".encode(), datum(data=j, label=7 - i, encoded=True)) for i, j in enumerate(jpegs)
    ]
    path = write_db(tmp_path / "enc", items)
    with stoker.formats.open(path) as r:
        assert r.layout == "datum"
        got = _all(r)
        assert [bytes(g[0]) for g in got] == jpegs  # byte-identical: convert keeps them
        assert [g[1] for g in got] == [7 - i for i in range(6)]
        np.testing.assert_array_equal(r.labels(), [7 - i for i in range(6)])


def test_lsun_values_are_the_image_files_with_a_per_database_class(lsun_db):
    path, items = lsun_db
    with stoker.formats.open(path, label=3, class_names=["a", "b", "c", "bedroom"]) as r:
        assert r.layout == "image" and len(r) == 10
        assert r.class_names == ["a", "b", "c", "bedroom"]
        np.testing.assert_array_equal(r.labels(), np.full(10, 3))
        got = _all(r)
        assert [bytes(g[0]) for g in got] == list(items.values())
        assert [r.lmdb_key(i) for i in range(10)] == list(items)
        assert {g[1] for g in got} == {3}
        for g, v in zip(got, items.values(), strict=True):
            np.testing.assert_array_equal(decode(g[0]), decode(v))
    with stoker.formats.open(path) as r:  # no labels given: one class, 0
        np.testing.assert_array_equal(r.labels(), np.zeros(10))


def test_lsun_labels_from_a_key_list_file_and_from_a_mapping(lsun_db, tmp_path):
    path, items = lsun_db
    want = {k: (int(k[:4], 16) % 5) for k in items}
    lines = ["key,label", "# written by hand", ""]
    lines += [f"{k.decode()},{v}" for k, v in reversed(want.items())]
    lines.append("not_in_this_database,9")  # ignored: one list may serve several databases
    lst = tmp_path / "labels.csv"
    lst.write_text("\n".join(lines) + "\n")
    expected = list(want.values())
    with stoker.formats.open(path, labels=str(lst)) as r:
        np.testing.assert_array_equal(r.labels(), expected)
        assert [g[1] for g in _all(r)] == expected
    with stoker.formats.open(path, labels=lst) as r:  # cached now: the same
        np.testing.assert_array_equal(r.labels(), expected)
    tsv = tmp_path / "labels.tsv"
    tsv.write_text("".join(f"{k.decode()}\t{v}\n" for k, v in want.items()))
    with stoker.formats.open(path, labels=tsv) as r:
        np.testing.assert_array_equal(r.labels(), expected)
    mapping = {k.decode(): v for k, v in want.items()}
    with stoker.formats.open(path, labels=mapping) as r:
        np.testing.assert_array_equal(r.labels(), expected)
        assert [g[1] for g in _all(r)] == expected


def test_label_list_errors_name_the_file_line_and_key(lsun_db, tmp_path):
    path, items = lsun_db
    keys = [k.decode() for k in items]
    bad = tmp_path / "bad.csv"
    bad.write_text(f"{keys[0]},1\n{keys[1]},one\n")
    with pytest.raises(ValueError, match=r"bad.csv, line 2: label 'one' is not an integer"):
        stoker.formats.open(path, labels=bad).labels()
    bad.write_text(f"{keys[0]},1\n\n{keys[0]},2\n")
    with pytest.raises(ValueError, match=r"line 3: key .* already has a label on line 1"):
        stoker.formats.open(path, labels=bad).labels()
    bad.write_text("".join(f"{k},1\n" for k in keys[:-1]))
    with pytest.raises(LmdbFormatError, match=rf"LMDB key '{keys[-1]}', position 9: has no label"):
        stoker.formats.open(path, labels=bad).labels()
    with pytest.raises(LmdbFormatError, match="has no label in labels="):
        stoker.formats.open(path, labels={keys[0]: 1}).labels()
    with pytest.raises(ValueError, match="not both"):
        stoker.formats.open(path, label=1, labels={})
    with pytest.raises(ValueError, match="a label must be an integer"):
        stoker.formats.open(path, labels={keys[0]: 1.5})
    with pytest.raises(FileNotFoundError):
        stoker.formats.open(path, labels=tmp_path / "missing.csv")


def test_layout_named_by_the_caller(raw_db, lsun_db):
    with stoker.formats.open(raw_db[0], layout="image") as r:
        with pytest.raises(
            LmdbFormatError, match=r"not an encoded image \(it parses as a Caffe Datum"
        ):
            r.read(0)
    with stoker.formats.open(lsun_db[0], layout="datum") as r:
        with pytest.raises(LmdbFormatError, match=r"position 0.*not a valid Caffe Datum"):
            r.read(0)
    with pytest.raises(ValueError, match="layout must be one of"):
        stoker.formats.open(raw_db[0], layout="caffe")
    with pytest.raises(ValueError, match="carries its own labels"):
        stoker.formats.open(raw_db[0], label=1)


def test_sniff_extensions_and_a_single_file_database(tmp_path, raw_db):
    path, images = raw_db
    assert sniff(path) and stoker.formats.format_of(path).name == "lmdb"
    assert not sniff(tmp_path / "cache") and not sniff(tmp_path / "nothing")
    items = [(b"k%d" % i, raw_datum(images[i], i)) for i in range(3)]
    single = write_db(tmp_path / "one.mdb", items, subdir=False)
    assert sniff(single) and stoker.formats.format_of(single).name == "lmdb"
    with stoker.formats.open(single) as r:
        assert len(r) == 3 and r.labels().tolist() == [0, 1, 2]
        np.testing.assert_array_equal(r.read(2)[0], images[2][:, :, ::-1])
    named = write_db(tmp_path / "set.lmdb", items)  # a folder named like a file
    with stoker.formats.open(named) as r:
        assert len(r) == 3
    with pytest.raises(FileNotFoundError):
        stoker.formats.open(tmp_path / "gone.lmdb")


def test_describe_reader_contract_and_errors(raw_db):
    path, _ = raw_db
    with stoker.formats.open(path) as r:
        assert r.describe(3) == f"LMDB key '00000003_img3.jpg' (position 3) of {path}"
        assert r.key(3) == 3 and r.lmdb_key(3) == b"00000003_img3.jpg"
        with pytest.raises(SpecError, match="no fields"):
            r.reader(None, ("boxes",))
        f = r.reader()
        for bad in (-1, 12):
            with pytest.raises(IndexError, match="out of range for 12 records"):
                f(bad)
        with pytest.raises(IndexError):
            r.key(12)


def test_fingerprint_is_stable_and_tracks_keys_and_labels(lsun_db):
    path, _ = lsun_db
    with stoker.formats.open(path, label=1) as a, stoker.formats.open(path, label=1) as b:
        fa = a.fingerprint()
        assert fa == b.fingerprint() == pickle.loads(pickle.dumps(a)).fingerprint()
        assert fa["format"] == "lmdb" and fa["len"] == 10 and fa["layout"] == "image"
    with stoker.formats.open(path, label=2) as c:
        assert c.fingerprint()["sha"] != fa["sha"]


def _digests(r):
    """What a worker sees: (sha256 of the image bytes, label) of every sample."""
    return [(hashlib.sha256(bytes(g[0])).hexdigest(), g[1]) for g in _all(r)]


def _fork_child(r, conn):
    try:
        out = _digests(r)
        conn.send((out, r._handle._pid == os.getpid()))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        conn.send(repr(e))
    finally:
        conn.close()


def test_pickled_reader_reads_in_a_fresh_process(raw_db, lsun_db):
    want = []
    readers = [stoker.formats.open(raw_db[0]), stoker.formats.open(lsun_db[0], label=5)]
    for r in readers:
        want.append(_digests(r))
        blob = pickle.dumps(r)
        assert len(blob) < 2000  # configuration only: no environment, no key list
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        got = pool.map(_digests, readers)
        pool.close()
        pool.join()
    for r in readers:
        r.close()
    assert got == want


def test_forked_child_opens_its_own_environment(raw_db):
    with stoker.formats.open(raw_db[0]) as r:
        want = _digests(r)  # the parent's environment is open now
        parent_env = r._handle.get()
        ctx = mp.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_fork_child, args=(r, send))
        p.start()
        send.close()
        got = recv.recv()
        recv.close()
        p.join(10)
        assert p.exitcode == 0
        assert got == (want, True)
        assert r._handle.get() is parent_env  # the parent's own is untouched
        assert _digests(r) == want


def test_many_readers_of_one_database_in_one_process(raw_db):
    path, _ = raw_db
    a = stoker.formats.open(path)
    b = pickle.loads(pickle.dumps(a))
    want = _digests(a)
    a.close()
    assert _digests(b) == want  # closing one leaves the shared environment to the other
    b.close()
    with stoker.formats.open(path) as c:
        assert _digests(c) == want


def test_read_only_copy_opens_and_reads(raw_db, tmp_path):
    path, images = raw_db
    ro = tmp_path / "ro_copy"
    shutil.copytree(path, ro)
    before = sorted(os.listdir(ro))
    for name in os.listdir(ro):
        os.chmod(ro / name, 0o444)
    os.chmod(ro, 0o555)
    try:
        with stoker.formats.open(ro) as r:
            assert len(r) == 12
            np.testing.assert_array_equal(r.labels(), np.arange(12) % 4)
            np.testing.assert_array_equal(r.read(5)[0], images[5][:, :, ::-1])
        assert stoker.formats.lmdb.verify(ro).ok
        assert sorted(os.listdir(ro)) == before  # nothing written beside the data
    finally:
        os.chmod(ro, 0o755)
        for name in os.listdir(ro):
            os.chmod(ro / name, 0o644)


def test_missing_lmdb_package_gives_the_install_hint(raw_db, monkeypatch):
    monkeypatch.setitem(sys.modules, "lmdb", None)
    with pytest.raises(ImportError, match=r'pip install "stoker\[lmdb\]"'):
        stoker.formats.open(raw_db[0])


def test_lmdb_is_imported_only_when_a_database_opens():
    code = (
        "import sys, stoker.formats, stoker.formats.lmdb; "
        "stoker.formats.format_of('x.lmdb'); assert 'lmdb' not in sys.modules"
    )
    import subprocess

    subprocess.run([sys.executable, "-c", code], check=True)


def test_inspect_facts_and_files(raw_db):
    path, _ = raw_db
    with stoker.formats.open(path) as r:
        assert r.files() == [os.path.join(path, "data.mdb")]
        s = r.summary()
        assert s["layout"] == "datum" and s["labels_from"] == "each Datum"
        assert s["first_keys"][0] == "'00000000_img0.jpg'" and s["data_bytes"] > 0


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_reads_both_layouts_through_the_seam(tmp_path, workers):
    """stoker.Loader over LMDB: the batches hold the stored images (decoded) and labels in
    position order, with and without worker processes."""
    from stoker import Loader
    from stoker.transforms import CenterCrop

    images = [photo(i) for i in range(10)]
    raw = write_db(
        tmp_path / "raw", [(b"%02d" % i, raw_datum(im, i % 3)) for i, im in enumerate(images)]
    )
    jpegs = {lsun_key(i): encode(im, ".jpg") for i, im in enumerate(images)}
    lsun = write_db(tmp_path / "lsun", list(jpegs.items()))
    order = sorted(jpegs)
    cases = [
        (raw, [im[:, :, ::-1] for im in images], [i % 3 for i in range(10)], {}),
        (lsun, [decode(jpegs[k]) for k in order], [4] * 10, {"label": 4}),
    ]
    for path, want_images, want_labels, options in cases:
        source = stoker.formats.open(path, **options)
        got_images, got_labels = [], []
        with Loader(
            source, batch_size=4, workers=workers, transforms=CenterCrop((24, 32))
        ) as loader:
            for batch in loader:
                got_images.extend(np.array(batch.images))
                got_labels.extend(batch.labels.tolist())
        source.close()
        assert got_labels == want_labels
        for got, want in zip(got_images, want_images, strict=True):
            np.testing.assert_array_equal(got, want)


def test_raw_datums_reach_the_batch_with_the_pixels_of_their_png_and_no_png_made(
    tmp_path, monkeypatch
):
    """The loader writes a raw Datum's pixels into the batch without a decode: no PNG is
    written (every PNG writer refuses here) and the batch holds the pixels the PNG each raw
    Datum was once read as decodes to, for BGR, grey and BGRA Datums."""
    import stoker.formats.base
    import stoker.formats.lmdb.datum
    import stoker.formats.lmdb.reader
    from stoker import Loader

    bgr = [photo(i) for i in range(4)]
    grey = [photo(10 + i)[:, :, 1] for i in range(3)]
    bgra = [np.dstack([photo(20 + i), photo(30 + i)[:, :, 0]]) for i in range(3)]
    chws = [im.transpose(2, 0, 1) for im in bgr] + [im[None] for im in grey]
    chws += [im.transpose(2, 0, 1) for im in bgra]
    images = bgr + grey + bgra
    path = write_db(
        tmp_path / "raw", [(b"%02d" % i, raw_datum(im, i)) for i, im in enumerate(images)]
    )
    before = [decode(encode_png(np.ascontiguousarray(c).tobytes(), *c.shape)) for c in chws]

    def refuse(*a, **k):
        raise AssertionError("a PNG was written on the read path")

    for module in (stoker.formats.base, stoker.formats.lmdb.datum, stoker.formats.lmdb.reader):
        name = "encode_png" if module is stoker.formats.base else "png_of"
        monkeypatch.setattr(module, name, refuse)
    with Loader(path, batch_size=5, workers=0) as ld:
        got = [(b.images.copy(), b.labels.copy()) for b in ld]
    assert np.concatenate([g[1] for g in got]).tolist() == list(range(10))
    for have, want in zip(np.concatenate([g[0] for g in got]), before, strict=True):
        np.testing.assert_array_equal(have, want)
