"""Property tests: anything written reads back byte for byte, and the file is dmlc's layout."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
from _recordio_util import MAGIC_LE, naive_frame
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stoker.formats.recordio import (
    IRHeader,
    RecordFile,
    RecordWriter,
    frame_record,
    iter_records,
    pack_header,
    unpack_header,
)


@st.composite
def payloads_with_magic(draw):
    """Random bytes with the magic spliced in at chosen (aligned or unaligned) offsets."""
    data = bytearray(draw(st.binary(max_size=64)))
    for pos in draw(st.lists(st.integers(0, 70), max_size=4)):
        pos = min(pos, len(data))
        data[pos:pos] = MAGIC_LE
    return bytes(data)


SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(payloads_with_magic())
def test_frame_equals_literal_dmlc_rule(data):
    assert frame_record(data) == naive_frame(data)


@SETTINGS
@given(st.lists(payloads_with_magic(), max_size=8), st.booleans())
def test_write_read_round_trip(tmp_path_factory, items, shuffle_keys):
    d = tmp_path_factory.mktemp("rt")
    keys = list(range(len(items)))
    if shuffle_keys:
        keys = [k * 7 + 3 for k in reversed(keys)]
    rec = d / "x.rec"
    with RecordWriter(rec, checksums=True) as w:
        for k, p in zip(keys, items):
            w.write(k, p)
    # on disk: exactly the concatenation of the literal framing
    assert rec.read_bytes() == b"".join(naive_frame(p) for p in items)
    with RecordFile(rec, verify_checksums=True) as r:  # any payload: a file's records
        assert len(r) == len(items)
        assert r.keys.tolist() == keys
        for i, p in enumerate(items):
            assert bytes(r.read(i)) == p
    # a sequential walk (no .idx) agrees
    assert [p for _, p in iter_records(rec)] == items


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.one_of(
                st.floats(width=32, allow_nan=False),
                st.lists(st.floats(width=32, allow_nan=False), min_size=1, max_size=5),
            ),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
            payloads_with_magic(),
        ),
        max_size=6,
    )
)
def test_irheader_round_trip(tmp_path_factory, recs):
    d = tmp_path_factory.mktemp("hd")
    rec = d / "h.rec"
    with RecordWriter(rec) as w:
        for i, (label, id_, id2, img) in enumerate(recs):
            w.write(i, pack_header(IRHeader(0, label, id_, id2), img))
    with RecordFile(rec) as r:
        for i, (label, id_, id2, img) in enumerate(recs):
            h, got = r.read_header(i)
            assert (h.id, h.id2) == (id_, id2) and bytes(got) == img
            if isinstance(label, list):
                assert h.flag == len(label)
                assert h.label.tolist() == np.asarray(label, np.float32).tolist()
            else:
                assert h.flag == 0 and h.label == np.float32(label)


def test_labels_vectorised_match_headers(tmp_path):
    rec = tmp_path / "l.rec"
    with RecordWriter(rec) as w:
        for i in range(40):
            img = MAGIC_LE * (i % 3) + bytes(i)  # some records split into parts
            w.write(i, pack_header(IRHeader(0, [i, -i, 0.5], i, 0), img))
    with RecordFile(rec) as r:
        lab = r.labels()
        assert lab.shape == (40, 3) and lab.dtype == np.float32
        for i in range(40):
            assert lab[i].tolist() == r.read_header(i)[0].label.tolist()
        assert r.labels([5, -1]).tolist() == [[5, -5, 0.5], [39, -39, 0.5]]
    rec2 = tmp_path / "s.rec"
    with RecordWriter(rec2) as w:
        for i in range(10):
            w.write(i, pack_header(IRHeader(0, float(i), 0, 0), MAGIC_LE if i == 4 else b"x"))
    with RecordFile(rec2) as r:
        assert r.labels().tolist() == [float(i) for i in range(10)]


def test_labels_mixed_layouts_need_positions(tmp_path):
    rec = tmp_path / "m.rec"
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(0, [1, 2], 0, 0)))
        w.write(1, pack_header(IRHeader(0, 3.0, 0, 0), b"x"))
    with RecordFile(rec) as r:
        with pytest.raises(ValueError, match="different label counts"):
            r.labels()  # mixed label counts are never silently merged
        assert r.labels([1]).tolist() == [3.0]


def test_read_is_zero_copy_for_single_part_records(tmp_path):
    rec = tmp_path / "z.rec"
    with RecordWriter(rec) as w:
        w.write(0, b"hello world!")
    with RecordFile(rec) as r:
        v = r.read(0)
        assert isinstance(v, memoryview) and v.readonly and bytes(v) == b"hello world!"
        assert v.obj is not None and not isinstance(v.obj, bytes)  # a view of the mapping
        del v


def test_pickle_reopens_in_another_process_state(tmp_path):
    rec = tmp_path / "p.rec"
    with RecordWriter(rec) as w:
        for i in range(5):
            w.write(i, struct.pack("<I", i) * 3)
    with RecordFile(rec) as r:
        blob = pickle.dumps(r)
        assert len(blob) < 1000  # paths and options, not data or handles
    with pickle.loads(blob) as r2:
        assert bytes(r2.read(4)) == struct.pack("<I", 4) * 3


def test_unpack_header_returns_view_into_buffer():
    buf = pack_header(IRHeader(0, 1.0, 0, 0), b"abc")
    h, img = unpack_header(memoryview(buf))
    assert img.obj is buf and bytes(img) == b"abc"


def test_positions_of_keys_sorted_and_unsorted(tmp_path):
    for name, keys in (("s", [2, 5, 9, 11]), ("u", [9, 2, 11, 5])):
        rec = tmp_path / f"{name}.rec"
        with RecordWriter(rec) as w:
            for k in keys:
                w.write(k, struct.pack("<I", k))
        with RecordFile(rec) as r:
            assert r.positions([11, 2]).tolist() == [keys.index(11), keys.index(2)]
            assert r.position(5) == keys.index(5)
            assert bytes(r.read(r.position(9))) == struct.pack("<I", 9)
            with pytest.raises(KeyError, match="key 7"):
                r.position(7)
            assert not r.keys.flags.writeable


def test_magic_inside_the_irheader_splits_there_and_reads_back(tmp_path):
    """id = magic puts the magic at payload offset 8 (aligned): the header itself is split."""
    magic = 0xCED7230A
    rec = tmp_path / "hm.rec"
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(0, 1.5, magic, magic << 32), b"img"))
        w.write(1, pack_header(IRHeader(0, [2.5], magic, 0), MAGIC_LE))
        w.write(2, pack_header(IRHeader(0, 3.5, 0, 0), b"plain"))
    raw = rec.read_bytes()
    assert raw[4:8] == struct.pack("<I", 1 << 29 | 8)  # first part: cflag 1, 8 bytes
    with RecordFile(rec) as r:
        h, img = r.read_header(0)
        assert (h.id, h.id2, bytes(img)) == (magic, magic << 32, b"img")
        with pytest.raises(ValueError, match="different label counts"):
            r.labels()
        assert r.labels([0, 2]).tolist() == [1.5, 3.5]
        assert r.labels([1]).tolist() == [[2.5]]
