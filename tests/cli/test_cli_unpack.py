"""`stoker unpack` of an insightface set writes its images only, one folder per identity, and
keeps the header and identity records in identities.json; `--json`; it checks CRC32C."""

from __future__ import annotations

import json
import os

import cv2
import numpy as np
import pytest

from stoker._core.errors import CorruptRecordError
from stoker.cli import main
from stoker.cli.unpack import unpack
from stoker.formats.recordio import IRHeader, RecordFile, RecordWriter, pack_header


def _jpeg(k: int) -> bytes:
    img = np.full((12, 10, 3), (17 * k) % 256, np.uint8)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


def _faces(path, per_identity=(3, 1, 2)):
    """An MS1M-layout .rec as face2rec writes it (header record 0 last, flag 2 labels (a, b))."""
    idents = [j for j, n in enumerate(per_identity) for _ in range(n)]
    a = 1 + len(idents)
    b = a + len(per_identity)
    with RecordWriter(path) as w:
        for k, ident in enumerate(idents, start=1):
            w.write(k, pack_header(IRHeader(0, float(ident), k, 0), _jpeg(k)))
        start = 1
        for j, n in enumerate(per_identity):
            w.write(a + j, pack_header(IRHeader(0, [start, start + n], 0, 0), b""))
            start += n
        w.write(0, pack_header(IRHeader(0, [a, b], 7, 0), b""))
    return a, b


def test_unpack_of_an_insightface_rec_writes_images_by_identity_and_the_table(tmp_path, capsys):
    rec = tmp_path / "train.rec"
    a, b = _faces(rec)
    out = tmp_path / "out"
    assert main(["unpack", str(rec), str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] == 6 and summary["folders"] == 3
    assert summary["metadata_records"] == 4  # the header and 3 identity records
    assert summary["format"] == "recordio"
    assert summary["identity_table"] == str(out / "identities.json")
    # only images, one folder per identity, named by the key, nothing for the metadata
    assert sorted(os.listdir(out)) == ["0", "1", "2", "identities.json"]
    assert sorted(os.listdir(out / "0")) == ["1.jpg", "2.jpg", "3.jpg"]
    assert os.listdir(out / "1") == ["4.jpg"] and sorted(os.listdir(out / "2")) == [
        "5.jpg",
        "6.jpg",
    ]
    assert (out / "2" / "6.jpg").read_bytes() == _jpeg(6)
    table = json.loads((out / "identities.json").read_text())
    assert table["layout"] == "insightface" and table["records"] == 10
    assert table["header"] == {"key": 0, "flag": 2, "label": [a, b], "id": 7, "id2": 0}
    assert table["image_keys"] == [1, a]
    assert table["identities"] == [
        {"key": 7, "start_key": 1, "end_key": 4, "folder": "0"},
        {"key": 8, "start_key": 4, "end_key": 5, "folder": "1"},
        {"key": 9, "start_key": 5, "end_key": 7, "folder": "2"},
    ]
    # the files of every identity are the keys its range names
    for ident in table["identities"]:
        files = sorted(int(n.split(".")[0]) for n in os.listdir(out / ident["folder"]))
        assert files == list(range(ident["start_key"], ident["end_key"]))
    # a second run refuses to overwrite the table, as the images, unless asked
    assert main(["unpack", str(rec), str(out), "--quiet"]) == 1
    assert "identities.json exists" in capsys.readouterr().err
    assert main(["unpack", str(rec), str(out), "--overwrite"]) == 0
    line = capsys.readouterr().out
    assert "wrote 6 images in 3 folders" in line and "4 metadata records" in line
    assert not list(out.glob("*.partial"))


def test_unpack_json_of_a_plain_set_has_no_identity_table(tmp_path, capsys):
    rec = tmp_path / "plain.rec"
    with RecordWriter(rec) as w:
        for k in range(4):
            w.write(k, pack_header(IRHeader(0, float(k % 2), k, 0), _jpeg(k)))
    out = tmp_path / "out"
    assert main(["unpack", str(rec), str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["images"] == 4 and summary["folders"] == 2
    assert summary["metadata_records"] == 0 and summary["identity_table"] is None
    assert sorted(os.listdir(out)) == ["0", "1"]


def test_unpack_of_an_insightface_set_writes_the_images_only(tmp_path):
    rec = tmp_path / "faces.rec"
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(0, [4, 6], 0, 0), b""))
        for k, ident in ((1, 0), (2, 0), (3, 1)):
            w.write(k, pack_header(IRHeader(0, float(ident), k, 0), b"face%d" % k))
        w.write(4, pack_header(IRHeader(0, [1, 3], 0, 0), b""))
        w.write(5, pack_header(IRHeader(0, [3, 4], 0, 0), b""))
    out = tmp_path / "out"
    assert unpack(str(rec), str(out), progress=False) == 3
    assert sorted(os.listdir(out)) == ["0", "1", "identities.json"]
    assert sorted(os.listdir(out / "0")) == ["1.bin", "2.bin"]


def test_unpack_checks_the_checksums(tmp_path):
    rec = tmp_path / "d.rec"
    with RecordWriter(rec, checksums=True) as w:
        for k in range(3):
            w.write(k, pack_header(IRHeader(0, 1.0, k, 0), b"payload-%d" % k))
    with RecordFile(rec) as r:
        off = r.offset(1)
    data = bytearray(rec.read_bytes())
    data[off + 8 + 24] ^= 1
    rec.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match="key 1, byte offset"):
        unpack(str(rec), str(tmp_path / "out"), progress=False)
