"""insightface/face2rec layout: header record 0, images 1..a-1, identity records a..b-1."""

from __future__ import annotations

import numpy as np
import pytest
from _recordio_util import face_set

from stoker._core.errors import CorruptRecordError
from stoker.formats.recordio import (
    IRHeader,
    RecordFile,
    RecordWriter,
    pack_header,
    verify_records,
)
from stoker.formats.recordio.seam import RecordIOReader


def _ranges(r: RecordIOReader) -> list[list[int]] | None:
    """The ``[start_key, end_key)`` of each identity, from the reader's identity table."""
    table = r.identity_table()
    return None if table is None else [[t["start_key"], t["end_key"]] for t in table["identities"]]


@pytest.mark.parametrize("header_last", [True, False])
def test_identity_ranges_and_image_keys(tmp_path, header_last):
    rec = tmp_path / "faces.rec"
    a, b = face_set(rec, header_last=header_last)
    with RecordIOReader(rec) as r:
        assert (a, b) == (9, 12) and len(r.shard(0)._file()) == 12 and len(r) == 8
        assert _ranges(r) == [[1, 4], [4, 5], [5, 9]]
        assert r.shard(0).layout.ranges.dtype == np.int64
        assert r.keys().tolist() == list(range(1, 9))
        assert [r.key(i) for i in range(8)] == list(range(1, 9))
        assert r.labels().tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
        img, _label = r.read(0)
        assert bytes(img) == b"\xff\xd8jpeg1"
    assert verify_records(rec).ok


def test_images_view_skips_header_and_identity_records(tmp_path):
    import pickle

    rec = tmp_path / "faces.rec"
    face_set(rec, per_identity=(2, 3))
    with RecordIOReader(rec) as imgs:
        with pytest.raises(ValueError, match="different label counts"):
            imgs.shard(0)._file().labels()  # header/identity records carry 2 labels, images 1
        assert len(imgs) == 5 and imgs.keys().tolist() == [1, 2, 3, 4, 5]
        assert imgs.labels().tolist() == [0, 0, 1, 1, 1]
        assert imgs.read(4)[1] == 1
        assert bytes(imgs.read(0)[0]) == b"\xff\xd8jpeg1"
        assert _ranges(imgs) == [[1, 3], [3, 6]]
        copy = pickle.loads(pickle.dumps(imgs))
        try:
            assert len(copy) == 5 and bytes(copy.read(4)[0]) == bytes(imgs.read(4)[0])
        finally:
            copy.close()
    plain = tmp_path / "plain.rec"
    with RecordWriter(plain) as w:
        w.write(0, pack_header(IRHeader(0, 1.0, 0, 0), b"x"))
    with RecordIOReader(plain) as r:
        assert len(r) == 1 and r.identity_table() is None


def test_plain_sets_have_no_identity_ranges(tmp_path):
    rec = tmp_path / "plain.rec"
    with RecordWriter(rec) as w:
        for k in range(5):
            w.write(k, pack_header(IRHeader(0, [k, k + 1], 0, 0), b"img"))  # 2 labels, images
    with RecordIOReader(rec) as r:
        assert r.identity_table() is None and len(r) == 5
    rec2 = tmp_path / "plain2.rec"
    with RecordWriter(rec2) as w:
        w.write(0, pack_header(IRHeader(0, [0.5, 2.25], 0, 0), b""))  # not integers
        w.write(1, pack_header(IRHeader(0, 1.0, 0, 0), b"img"))
    with RecordIOReader(rec2) as r:
        assert r.identity_table() is None


def test_identity_record_out_of_range_is_reported(tmp_path):
    def breaker(recs, a, b):
        recs[a + 1] = pack_header(IRHeader(0, [2, 99], 0, 0), b"")

    rec = tmp_path / "bad.rec"
    a, _ = face_set(rec, breaker=breaker)
    with pytest.raises(CorruptRecordError) as ei:
        RecordIOReader(rec)  # the layout is checked when the set is opened
    assert ei.value.key == a + 1 and "outside the image keys" in str(ei.value)


def test_header_naming_missing_keys_is_reported(tmp_path):
    def breaker(recs, a, b):
        del recs[a + 2]

    rec = tmp_path / "missing.rec"
    face_set(rec, breaker=breaker)
    with pytest.raises(CorruptRecordError, match="insightface header"):
        RecordIOReader(rec)


def test_a_file_reader_knows_no_layout_the_opened_set_does(tmp_path):
    # RecordFile reads the file; the set's reader recognises insightface's layout
    rec = tmp_path / "faces.rec"
    face_set(rec, per_identity=(2, 3))
    with RecordFile(rec) as r:
        assert not hasattr(r, "identity_ranges") and not hasattr(r, "images") and len(r) == 8
    with RecordIOReader(rec) as r:
        assert r.keys().tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("header_last", [True, False])
def test_the_identity_table_is_the_header_and_identity_records(tmp_path, header_last):
    from stoker.formats import open_reader

    rec = tmp_path / "faces.rec"
    a, b = face_set(rec, header_last=header_last)
    with open_reader(rec) as r:
        table = r.identity_table()
    assert table["layout"] == "insightface" and table["records"] == 12
    assert table["metadata_records"] == 4 and table["image_keys"] == [1, a]
    assert table["header"] == {"key": 0, "flag": 2, "label": [a, b], "id": 0, "id2": 0}
    assert [(t["key"], t["start_key"], t["end_key"]) for t in table["identities"]] == [
        (9, 1, 4),
        (10, 4, 5),
        (11, 5, 9),
    ]
    plain = tmp_path / "plain.rec"
    with RecordWriter(plain) as w:
        w.write(0, pack_header(IRHeader(0, 1.0, 0, 0), b"x"))
    with open_reader(plain) as r:
        assert r.identity_table() is None


def _nonempty(buf: bytes) -> None:
    if not buf:
        raise ValueError("0 bytes is not an image")


def test_verify_decode_skips_only_the_header_and_identity_records(tmp_path):
    rec = tmp_path / "f.rec"
    face_set(rec, per_identity=(2, 3))
    rep = verify_records(rec, decode=_nonempty, progress=False)
    assert rep.ok and rep.decoded == 5  # 5 images; the header and 2 identity records hold none
    plain = tmp_path / "p.rec"
    with RecordWriter(plain) as w:
        w.write(0, pack_header(IRHeader(0, 1.0, 0, 0), b""))  # one label: an empty image
        w.write(1, pack_header(IRHeader(0, [0.5, 2.0], 1, 0), b""))  # not integer labels
    rep = verify_records(plain, decode=_nonempty, progress=False)
    assert [p.key for p in rep.problems] == [0, 1]
    assert all("0 bytes is not an image" in p.reason for p in rep.problems)
