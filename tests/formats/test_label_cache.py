"""The label cache of a .rec (in the cache directory): used when fresh, rebuilt when the files
change, never a reason to return labels that are not in the file."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from _recordio_util import face_set

from stoker.formats.recordio import IRHeader, RecordFile, RecordWriter, pack_header
from stoker.formats.recordio.labelcache import label_cache_path, read_label_cache
from stoker.formats.recordio.seam import RecordIOReader

OLD = time.time() - 3600  # files "modified an hour ago": past the racy window


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


def write(path, labels):
    with RecordWriter(path, overwrite=True) as w:
        for i, lab in enumerate(labels):
            w.write(i, pack_header(IRHeader(0, lab, i, 0), b"img%d" % i))
    for p in (path, str(path)[:-4] + ".idx"):
        os.utime(p, (OLD, OLD))


@pytest.mark.parametrize("labels", [[float(i % 7) for i in range(30)], [[i, -i] for i in range(9)]])
def test_labels_are_cached_and_read_back(tmp_path, labels):
    rec = str(tmp_path / "a.rec")
    write(rec, labels)
    with RecordFile(rec) as r:
        first = r.labels()
    assert os.path.exists(label_cache_path(rec))
    np.testing.assert_array_equal(read_label_cache(rec, rec[:-4] + ".idx", len(labels)), first)
    with RecordFile(rec) as r:
        np.testing.assert_array_equal(r.labels(), np.asarray(labels, np.float32))


def test_a_changed_rec_or_idx_is_not_served_from_the_cache(tmp_path):
    rec = str(tmp_path / "b.rec")
    write(rec, [1.0, 2.0, 3.0])
    with RecordFile(rec) as r:
        r.labels()
    write(rec, [7.0, 8.0, 9.0])  # same sizes, new content, new mtime
    with RecordFile(rec) as r:
        assert r.labels().tolist() == [7.0, 8.0, 9.0]
    with RecordFile(rec) as r:
        r.labels()
    assert read_label_cache(rec, rec[:-4] + ".idx", 3) is not None
    assert read_label_cache(rec, rec[:-4] + ".idx", 4) is None  # another count
    os.utime(rec, (OLD + 5, OLD + 5))  # rewritten in place: same size and inode, new mtime
    assert read_label_cache(rec, rec[:-4] + ".idx", 3) is None
    with RecordFile(rec) as r:
        r.labels()
    os.utime(rec[:-4] + ".idx", (OLD + 9, OLD + 9))  # the .idx alone changes
    assert read_label_cache(rec, rec[:-4] + ".idx", 3) is None


def test_fresh_files_and_damaged_caches(tmp_path):
    rec = str(tmp_path / "c.rec")
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(0, 5.0, 0, 0), b"x"))
    with RecordFile(rec) as r:
        assert r.labels().tolist() == [5.0]
    assert not os.path.exists(label_cache_path(rec))  # just written: too fresh to trust mtime
    write(rec, [5.0])
    with RecordFile(rec) as r:
        r.labels()
    with open(label_cache_path(rec), "r+b") as f:
        f.truncate(80)  # a torn cache is ignored, not trusted
    with RecordFile(rec) as r:
        assert r.labels().tolist() == [5.0]
    with RecordFile(rec, cache=False) as r:  # cache=False neither reads nor writes
        os.unlink(label_cache_path(rec))
        r.labels()
    assert not os.path.exists(label_cache_path(rec))


@pytest.mark.parametrize("header_last", [True, False])
def test_an_insightface_sets_image_labels_are_cached(tmp_path, monkeypatch, header_last):
    # the image records are a run of positions (1..M, or 0..M-1 when face2rec wrote the header
    # last); their labels are kept too, so a loader over MS1M does not read a page per record
    # on every start. Header and identity records carry other label counts and stay out.
    rec = str(tmp_path / "faces.rec")
    face_set(rec, per_identity=(3, 1, 4), header_last=header_last)
    for p in (rec, rec[:-4] + ".idx"):
        os.utime(p, (OLD, OLD))
    want = [0, 0, 0, 1, 2, 2, 2, 2]
    with RecordIOReader(rec) as r:  # an insightface set: its samples are the image records
        first = int(r.shard(0).rows[0])
        assert r.labels().tolist() == want
    assert first == (0 if header_last else 1)
    cached = read_label_cache(rec, rec[:-4] + ".idx", len(want), first)
    assert cached is not None and cached.tolist() == want
    assert read_label_cache(rec, rec[:-4] + ".idx", len(want), 1 - first) is None

    real, read = RecordFile._labels_at, []

    def recording(self, pos):
        read.extend(pos.tolist())
        return real(self, pos)

    with monkeypatch.context() as m:
        m.setattr(RecordFile, "_labels_at", recording)
        with RecordIOReader(rec) as r:
            assert r.labels().tolist() == want
            images = set(r.shard(0).rows.tolist())
    assert read and images.isdisjoint(read)  # only the identity records were read
    with RecordFile(rec) as r:  # other positions: read from the records, right values
        assert r.labels([first + 4, first + 5, first + 6]).tolist() == [2, 2, 2]
        assert r.labels([first + 3, first + 1]).tolist() == [1, 0]
        with pytest.raises(ValueError, match="different label counts"):
            r.labels()  # header and identity records with the images
