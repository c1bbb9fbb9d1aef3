"""``stoker convert``: any format the registry reads into any it writes, image bytes, labels and
fields untouched (RecordIO -> TFRecord -> WebDataset -> RecordIO, an insightface ``.rec`` to
WebDataset); rejects name the key and the byte offset; a stopped convert resumes; ``--json``."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

import stoker.formats as formats
from stoker import TooManyRejectsError
from stoker.cli import main
from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.pack import convert, pack


def jpeg(seed: int, size=(40, 32)) -> bytes:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def samples(path: str, fields: tuple[str, ...] = ()) -> list[tuple]:
    """Every sample through the registry: (image bytes, label, fields as plain lists)."""
    out = []
    with formats.open(path) as r:
        f = r.reader(None, fields)
        for i in range(len(r)):
            img, label, _key, flds = f(i)
            plain = {
                n: v if isinstance(v, (str, bytes)) else np.asarray(v).tolist()
                for n, v in flds.items()
            }
            out.append((bytes(img), np.asarray(label).tolist(), plain))
    return out


@pytest.fixture
def detection_set(tmp_path) -> str:
    """A RecordIO set packed from a listing with boxes, their classes and a caption."""
    src = tmp_path / "src"
    os.makedirs(src)
    rows = []
    for i in range(7):
        with open(src / f"{i}.jpg", "wb") as f:
            f.write(jpeg(i))
        boxes = [[1.0 + j, 2.0, 17.0 + j, 25.0] for j in range(i % 3)]
        rows.append(
            {
                "image": f"{i}.jpg",
                "label": i % 3,
                "boxes": boxes,
                "classes": [j + 2 for j in range(i % 3)],
                "text": f"photo {i}: ünïcode",
            }
        )
    with open(src / "rows.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    r = pack(str(src / "rows.jsonl"), tmp_path / "rec", workers=1, progress=False)
    return r.manifest


def test_recordio_tfrecord_wds_recordio_keeps_bytes_labels_and_fields(detection_set, tmp_path):
    names = ("boxes", "classes", "text")
    want = samples(detection_set, names)
    assert len(want) == 7 and want[2][2]["classes"] == [2, 3]
    src = detection_set
    for fmt in ("tfrecord", "wds", "recordio"):
        r = convert(src, tmp_path / f"via_{fmt}", format=fmt, workers=2, progress=False)
        assert (r.written, r.rejected, r.action) == (7, 0, "converted")
        got = samples(r.manifest, names)
        for (wi, wl, wf), (gi, gl, gf) in zip(want, got, strict=True):
            assert gi == wi and gl == wl and gf["classes"] == wf["classes"]
            assert gf["text"] == wf["text"]
            np.testing.assert_allclose(
                np.reshape(gf["boxes"], (-1, 4)), np.reshape(wf["boxes"], (-1, 4)), rtol=1e-6
            )
        with formats.open(r.manifest) as reader:
            assert reader.schema["boxes"].max_len == 2
        src = r.manifest
    # back in RecordIO, the records are the ones pack wrote, byte for byte
    with open(detection_set.replace(".stoker.json", ".rec"), "rb") as a:
        with open(src.replace(".stoker.json", ".rec"), "rb") as b:
            assert a.read() == b.read()


def _insightface_rec(path: str, per_identity=(3, 1, 2)) -> list[tuple[bytes, int]]:
    """A set laid out as insightface's face2rec writes it: header record 0 (written last),
    images 1..a-1, identity records a..b-1. Returns (image, identity) of every image."""
    images = [ident for ident, n in enumerate(per_identity) for _ in range(n)]
    a = 1 + len(images)
    recs, out = {}, []
    for k, ident in enumerate(images, start=1):
        img = jpeg(100 + k)
        recs[k] = pack_header(IRHeader(0, float(ident), k, 0), img)
        out.append((img, ident))
    start = 1
    for j, n in enumerate(per_identity):
        recs[a + j] = pack_header(IRHeader(0, [start, start + n], 0, 0), b"")
        start += n
    recs[0] = pack_header(IRHeader(0, [a, a + len(per_identity)], 0, 0), b"")
    with RecordWriter(path) as w:
        for k in sorted(recs, key=lambda k: k == 0):
            w.write(k, recs[k])
    return out


def test_insightface_rec_to_webdataset(tmp_path):
    want = _insightface_rec(str(tmp_path / "faces.rec"))
    r = convert(tmp_path / "faces.rec", tmp_path / "faces", format="wds", workers=1, progress=False)
    assert (r.written, r.rejected) == (6, 0)
    got = samples(r.manifest)
    assert [(g[0], g[1]) for g in got] == want  # header and identity records are not samples
    import webdataset as wds  # the package's own expander and grouping, on a file we close

    with open(os.path.join(tmp_path, "faces.tar"), "rb") as f:
        stream = wds.tariterators.tar_file_expander([{"url": "faces.tar", "stream": f}])
        seen = [(s["jpg"], int(s["cls"])) for s in wds.tariterators.group_by_keys(stream)]
    assert seen == want


def _corrupt_set(tmp_path) -> tuple[str, int]:
    """A packed RecordIO set whose record 4 has a flipped image byte; that record's offset."""
    src = tmp_path / "src"
    for i in range(10):
        os.makedirs(src / f"c{i % 2}", exist_ok=True)
        with open(src / f"c{i % 2}" / f"{i:02d}.jpg", "wb") as f:
            f.write(jpeg(i))
    r = pack(src, tmp_path / "set", workers=1, progress=False)
    with formats.open(r.manifest) as reader:
        where = reader.locate(4)
    assert where is not None
    rec, offset = where
    with open(rec, "r+b") as f:
        f.seek(offset + 8 + 24 + 200)  # framing, IRHeader, then inside the JPEG
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))
    return r.manifest, offset


def test_unreadable_record_is_a_reject_naming_key_and_offset(tmp_path):
    manifest, offset = _corrupt_set(tmp_path)
    with formats.open(manifest) as reader:
        key = reader.key(4)
    r = convert(manifest, tmp_path / "out", format="tfrecord", workers=2, progress=False)
    assert (r.written, r.rejected) == (9, 1)
    with open(r.rejects_path, encoding="utf-8") as f:
        rows = [line.split("\t") for line in f.read().splitlines()[1:]]
    assert len(rows) == 1 and rows[0][0] == str(key) and rows[0][2] == "unreadable"
    assert str(offset) in rows[0][3] and "set.rec" in rows[0][3]
    assert "position 4" in rows[0][3]


def test_stopped_convert_resumes(tmp_path):
    manifest, _ = _corrupt_set(tmp_path)
    os.makedirs(tmp_path / "clean")
    clean = convert(
        manifest, tmp_path / "clean" / "out", format="wds", shard_size=3, workers=1, progress=False
    )
    with pytest.raises(TooManyRejectsError, match="shards kept"):
        convert(
            manifest,
            tmp_path / "out",
            format="wds",
            shard_size=3,
            workers=1,
            max_rejects=0,
            progress=False,
        )
    assert not os.path.exists(tmp_path / "out.stoker.json")
    r = convert(manifest, tmp_path / "out", format="wds", shard_size=3, workers=1, progress=False)
    assert r.resumed == 9 and (r.written, r.rejected) == (9, 1)  # every shard was done
    assert [os.path.basename(s) for s in r.shards] == [os.path.basename(s) for s in clean.shards]
    for a, b in zip(r.shards, clean.shards, strict=True):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read()
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


def test_cli_convert_json_and_errors(detection_set, tmp_path, capsys):
    out = str(tmp_path / "cli")
    rc = main(["convert", detection_set, out, "--format", "tfrecord", "--json", "--workers", "1"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    assert report["written"] == 7 and report["format"] == "tfrecord"
    assert report["action"] == "converted" and report["manifest"] == out + ".stoker.json"
    assert [os.path.basename(s) for s in report["shards"]] == ["cli.tfrecord"]
    # again: the outputs are in the way
    rc = main(["convert", detection_set, out, "--format", "tfrecord", "--quiet"])
    assert rc == 1 and "--overwrite" in capsys.readouterr().err
    rc = main(["convert", str(tmp_path / "nothing.rec"), out + "2", "--format", "wds", "--quiet"])
    assert rc == 1 and "nothing.rec" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["convert", detection_set, out + "3", "--format", "lmdb"])  # read-only
    assert "invalid choice" in capsys.readouterr().err


def _lmdb(path: str, items: list[tuple[bytes, bytes]]) -> str:
    import lmdb

    env = lmdb.open(path, map_size=1 << 24, subdir=True)
    try:
        with env.begin(write=True) as txn:
            for k, v in items:
                assert txn.put(k, v)
    finally:
        env.close()
    return path


def test_lsun_lmdb_to_recordio_keeps_bytes_and_the_given_label(tmp_path):
    images = [jpeg(200 + i) for i in range(5)]
    keys = [f"{i * 2654435761 % (1 << 160):040x}".encode() for i in range(5)]
    db = _lmdb(str(tmp_path / "bedroom_lmdb"), list(zip(keys, images, strict=True)))
    r = convert(
        db,
        tmp_path / "bedroom",
        format="recordio",
        source_options={"label": 3},
        workers=1,
        progress=False,
    )
    assert (r.written, r.rejected) == (5, 0)
    got = samples(r.manifest)
    in_key_order = [img for _, img in sorted(zip(keys, images, strict=True))]  # LMDB sorts keys
    assert [g[0] for g in got] == in_key_order and {g[1] for g in got} == {3}


def test_caffe_datum_lmdb_to_recordio_keeps_encoded_bytes_and_labels(tmp_path):
    from stoker.formats.protowire import LEN, VARINT, encode_field

    images = [jpeg(300 + i) for i in range(4)]
    values = [
        encode_field(4, LEN, img) + encode_field(5, VARINT, i % 2) + encode_field(7, VARINT, 1)
        for i, img in enumerate(images)
    ]
    db = _lmdb(
        str(tmp_path / "caffe_lmdb"), [(f"{i:08d}".encode(), v) for i, v in enumerate(values)]
    )
    r = main(["convert", db, str(tmp_path / "caffe"), "--format", "recordio", "--quiet"])
    assert r == 0
    got = samples(str(tmp_path / "caffe.stoker.json"))
    assert [(g[0], g[1]) for g in got] == [(img, i % 2) for i, img in enumerate(images)]
