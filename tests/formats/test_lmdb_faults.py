"""LMDB values that are not what the layout says, broken databases, and the key list cache: every
bad value is a clear ``LmdbFormatError`` naming the database, the LMDB key, the position and
(for a Datum) the byte offset in the value; ``verify`` lists exactly the bad values."""

from __future__ import annotations

import os
import random
import time

import numpy as np
import pytest
from test_lmdb_util import datum, encode, lsun_key, photo, raw_datum, write_db

import stoker.formats
from stoker.codecs import decode
from stoker.formats.lmdb import LmdbFormatError, verify
from stoker.formats.lmdb import keylist as keylist_mod
from stoker.formats.protowire import LEN, VARINT, encode_field, encode_varint


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


GOOD = raw_datum(photo(0, 4, 4), 1)  # 4 x 4 x 3 = 48 pixel bytes

#: (name, bad Datum value, what the error says, byte offset in the value or None)
BAD_DATUMS = [
    (
        "dims disagree with data",
        datum(channels=3, height=4, width=4, data=bytes(47), label=0),
        r"3 x 4 x 4 = 48, but data holds 47 bytes",
        6,
    ),
    (
        "data length runs past the value",
        encode_field(1, VARINT, 3) + bytes([0x22]) + encode_varint(1000) + b"xx",
        r"field 4 claims 1000 bytes, only 2 remain",
        2,
    ),
    (
        "absurd data length",
        encode_field(1, VARINT, 3) + bytes([0x22]) + encode_varint(1 << 40) + bytes(10),
        r"claims 1099511627776 bytes, only 10 remain",
        2,
    ),
    (
        "label with the wrong wire type",
        GOOD + encode_field(5, LEN, b"1"),
        r"field 5 \(label\) has wire type 2",
        len(GOOD),
    ),
    (
        "negative height",
        datum(channels=3, height=-4, width=-4, data=bytes(48), label=0),
        r"3 x -4 x -4",
        None,
    ),
    (
        "float_data only",
        datum(channels=3, height=1, width=1, float_data=[0.5, 1.5, 2.5], label=0),
        r"holds float_data \(3 floats\), not image data",
        0,
    ),
    (
        "five channels",
        datum(channels=5, height=2, width=2, data=bytes(20), label=0),
        r"5 channels is not an image",
        0,
    ),
    ("truncated varint", GOOD + b"\x28\xff", r"varint runs past the end", len(GOOD) + 1),
    ("group wire type", GOOD + b"\x0b", r"wire type 3 \(groups", len(GOOD)),
    (
        "encoded data that is not an image",
        datum(data=b"GIF8 but not really", label=0, encoded=True),
        r"the encoded Datum's data \(19 bytes, starting 47 49 46 38.*is not an encoded image",
        0,
    ),
]


@pytest.mark.parametrize(
    ("name", "value", "says", "offset"), BAD_DATUMS, ids=[b[0] for b in BAD_DATUMS]
)
def test_bad_datum_values_name_the_key_position_and_offset(tmp_path, name, value, says, offset):
    items = [(b"00000000", GOOD), (b"00000001_bad", value), (b"00000002", GOOD)]
    path = write_db(tmp_path / "db", items)
    with stoker.formats.open(path) as r:  # detected from the good first value
        f = r.reader(np.arange(3))
        assert f(0)[0].shape == (4, 4, 3) and f(2)[1] == 1  # the neighbours still read
        with pytest.raises(LmdbFormatError, match=says) as info:
            f(1)
    e = info.value
    assert (e.key, e.position, e.path) == (b"00000001_bad", 1, path)
    assert str(e).startswith(f"{path}, LMDB key '00000001_bad', position 1")
    if offset is not None:
        assert e.offset == offset and f"byte {offset} of the value" in str(e)
    report = verify(path)
    assert not report.ok and report.problem_count == 1
    p = report.problems[0]
    assert (p.path, p.key) == (path, 1) and "LMDB key '00000001_bad', position 1" in p.reason


def test_a_bad_datum_label_field_stops_labels_with_its_key(tmp_path):
    bad = GOOD + encode_field(5, LEN, b"x")
    path = write_db(tmp_path / "db", [(b"a", GOOD), (b"b", bad)])
    with (
        stoker.formats.open(path) as r,
        pytest.raises(LmdbFormatError, match="LMDB key 'b', position 1"),
    ):
        r.labels()


def test_image_values_that_are_not_images(tmp_path):
    jpeg = encode(photo(3), ".jpg")
    items = [
        (lsun_key(0), jpeg),
        (lsun_key(1), b"this is text, not a picture"),
        (lsun_key(2), b""),
        (lsun_key(3), raw_datum(photo(4), 2)),
        (lsun_key(4), jpeg[: len(jpeg) // 2]),  # starts like a JPEG: only a decode finds it
    ]
    path = write_db(tmp_path / "db", items)
    with stoker.formats.open(path, label=0) as r:
        assert r.layout == "image"
        order = [r.lmdb_key(i) for i in range(len(r))]
        f = r.reader()
        for k, _ in items[1:4]:
            i = order.index(k)
            with pytest.raises(LmdbFormatError, match="is not an encoded image") as info:
                f(i)
            assert info.value.key == k and info.value.position == i
            assert k.decode() in str(info.value)
        with pytest.raises(
            LmdbFormatError, match=r"parses as a Caffe Datum: open with layout='datum'"
        ):
            f(order.index(lsun_key(3)))
    report = verify(path)
    assert sorted(p.key for p in report.problems) == sorted(order.index(k) for k, _ in items[1:4])
    report = verify(path, decode=decode)
    assert report.decoded == 2 and report.problem_count == 4
    cut = [p for p in report.problems if p.key == order.index(lsun_key(4))]
    assert len(cut) == 1 and "does not decode" in cut[0].reason


def test_a_first_value_of_no_known_layout_is_refused_at_open(tmp_path):
    path = write_db(tmp_path / "db", [(b"k", b"\x00\x01junk"), (b"l", GOOD)])
    with pytest.raises(
        LmdbFormatError, match=r"LMDB key 'k', position 0: cannot tell the layout.*layout='datum'"
    ):
        stoker.formats.open(path)
    with stoker.formats.open(path, layout="datum") as r:
        assert r.read(1)[1] == 1
    report = verify(path)  # detection moves on to the next value
    assert [p.key for p in report.problems] == [0]


def test_empty_and_broken_databases(tmp_path):
    empty = write_db(tmp_path / "empty", [])
    with pytest.raises(LmdbFormatError, match="has 0 records"):
        stoker.formats.open(empty)
    assert not verify(empty).ok
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "data.mdb").write_bytes(os.urandom(8192))
    with pytest.raises(LmdbFormatError, match=r"junk: not a readable LMDB database"):
        stoker.formats.open(junk)
    assert "not a readable LMDB database" in verify(junk).problems[0].reason
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(LmdbFormatError, match="holds no data.mdb"):
        stoker.formats.open(bare, format="lmdb")
    with pytest.raises(FileNotFoundError):
        verify(tmp_path / "nowhere")


def test_mutated_datums_read_or_fail_cleanly(tmp_path):
    """Seeded mutations (bit flips, truncations, inserted bytes) of Datum values: each reads as an
    image or raises LmdbFormatError; never another exception."""
    rnd = random.Random(16)
    base = [raw_datum(photo(i, 3 + i % 3, 4), i) for i in range(4)]
    base.append(datum(data=encode(photo(9), ".png"), label=3, encoded=True))
    items = [(b"0000", base[0])]
    for n in range(1, 400):
        v = bytearray(rnd.choice(base))
        kind = rnd.randrange(3)
        if kind == 0:
            for _ in range(rnd.randrange(1, 4)):
                j = rnd.randrange(len(v))
                v[j] ^= 1 << rnd.randrange(8)
        elif kind == 1:
            del v[rnd.randrange(1, len(v)) :]
        else:
            j = rnd.randrange(len(v))
            v[j:j] = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 6)))
        items.append((b"%04d" % n, bytes(v)))
    path = write_db(tmp_path / "db", items)
    clean = failed = 0
    with stoker.formats.open(path) as r:
        f = r.reader()
        for i in range(len(r)):
            t = time.perf_counter()
            try:
                img, _, _, _ = f(i)
                clean += 1
                if isinstance(img, np.ndarray):  # a raw Datum: its pixels
                    assert img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8
                else:  # the encoded one: its PNG
                    assert bytes(img[:4]) == b"\x89PNG"
            except LmdbFormatError as e:
                failed += 1
                assert e.position == i and e.key == b"%04d" % i
            assert time.perf_counter() - t < 2
    assert failed > 50 and clean > 10
    assert verify(path).problem_count == failed


# ------------------------------------------------------------------------- the key list cache


def _entries(tmp_path, kind):
    folder = tmp_path / "cache" / kind
    return sorted(folder.iterdir()) if folder.exists() else []


def test_key_list_is_built_once_then_mapped_from_the_cache(tmp_path, monkeypatch):
    path = write_db(
        tmp_path / "db", [(b"%03d" % i, raw_datum(photo(i, 3, 3), i)) for i in range(20)]
    )
    with stoker.formats.open(path) as r:
        keys = [r.lmdb_key(i) for i in range(20)]
        r.labels()
    (entry,) = _entries(tmp_path, "lmdb-keys")
    assert entry.name.endswith(".stklmk") and len(_entries(tmp_path, "lmdb-labels")) == 1

    def no_walk(env):
        raise AssertionError("the key list was walked again")

    monkeypatch.setattr(keylist_mod, "build_keys", no_walk)
    with stoker.formats.open(path) as r:
        assert [r.lmdb_key(i) for i in range(20)] == keys
        assert r.labels().tolist() == list(range(20))
    monkeypatch.undo()
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))

    # a database written again gets a new list
    write_db(path, [(b"000a", raw_datum(photo(1, 3, 3), 99))])
    with stoker.formats.open(path) as r:
        assert len(r) == 21 and r.lmdb_key(1) == b"000a" and r.labels()[1] == 99


@pytest.mark.parametrize("damage", ["truncate", "garbage", "offsets", "count"])
def test_a_damaged_key_list_cache_is_rebuilt(tmp_path, damage):
    path = write_db(
        tmp_path / "db", [(b"key%02d" % i, raw_datum(photo(i, 2, 2), i)) for i in range(8)]
    )
    stoker.formats.open(path).close()
    (entry,) = _entries(tmp_path, "lmdb-keys")
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        data = data[:-3]
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "offsets":
        data[40 + 8 * 3 : 40 + 8 * 4] = (10**6).to_bytes(8, "little")
    else:
        data[16:24] = (7).to_bytes(8, "little")
    entry.write_bytes(bytes(data))
    with stoker.formats.open(path) as r:
        assert [r.lmdb_key(i) for i in range(8)] == [b"key%02d" % i for i in range(8)]


def test_no_usable_cache_directory_still_reads(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_folder"
    blocker.write_bytes(b"")
    monkeypatch.setenv("STOKER_CACHE_DIR", str(blocker))
    path = write_db(tmp_path / "db", [(b"a", GOOD), (b"b", GOOD)])
    with stoker.formats.open(path) as r:
        assert len(r) == 2 and r.labels().tolist() == [1, 1]


def test_stoker_verify_and_inspect_on_a_database(tmp_path, capsys):
    from stoker.cli import main

    good = write_db(tmp_path / "good", [(b"a", GOOD), (b"b", GOOD)])
    bad = write_db(tmp_path / "bad", [(b"a", GOOD), (b"b", GOOD[:-5])])
    assert main(["verify", good, "--decode"]) == 0
    assert main(["verify", bad]) == 1
    out = capsys.readouterr().out
    assert "LMDB key 'b', position 1" in out and "not a valid Caffe Datum" in out
    assert main(["inspect", good]) == 0
    out = capsys.readouterr().out
    assert f"{good} (lmdb)" in out and "records:       2" in out
