"""``stoker.pack`` of a ``.jsonl``/``.csv`` listing: every field kind packed and read back
identically (``read_fields``, ``RecordSource.reader``), the inference rules, a given
schema, rejects naming the line and the field, and resume."""

from __future__ import annotations

import base64
import csv
import io
import json
import os

import numpy as np
import pytest
from packhelp import image_bytes, write
from PIL import Image

from stoker import pack
from stoker._core.errors import PackError, TooManyRejectsError
from stoker._core.schema import Field, Schema
from stoker.codecs import decode_mask, image_size
from stoker.formats.recordio import load_manifest, verify_records
from stoker.formats.recordio.seam import RecordIOReader
from stoker.loader.sources.records import RecordSource

N = 7


def _mask(i: int, size: tuple[int, int]) -> bytes:
    w, h = size
    im = Image.fromarray(np.random.default_rng(i).integers(0, 6, (h, w), dtype=np.uint8), "P")
    im.putpalette([(40 * k) % 256 for k in range(768)])
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def _rows(root, n: int = N) -> list[dict]:
    """Rows with every kind: class names, boxes with their classes (0..2 per image, an empty
    list among them), keypoints, a caption, a mask, a numeric vector and a scalar."""
    rows = []
    for i in range(n):
        size = (32 + 2 * i, 24)
        write(str(root / "img" / f"{i}.jpg"), image_bytes(size, seed=i))
        write(str(root / "seg" / f"{i}.png"), _mask(i, size))
        k = i % 3
        rows.append(
            {
                "image": f"img/{i}.jpg",
                "label": ["cat", "dog", "eel"][i % 3],
                "boxes": [[1.5 * j, 2.0, 10.25 + j, 20.0] for j in range(k)],
                "classes": [(i + j) % 5 for j in range(k)],
                "keypoints": [[[1.0, 2.0, 1.0], [3.0, 4.0, 0.0]] for _ in range(k)],
                "caption": f"a picture, nº {i} ✓",
                "seg_mask": f"seg/{i}.png",
                "attrs": [i * 0.5, -1.0, 2.0],
                "year": 2000 + i,
            }
        )
    return rows


WANT = Schema(
    {
        "image": Field.image(),
        "label": Field.numeric((), "int64", header=True),
        "boxes": Field.boxes(max_len=2),
        "classes": Field.ragged((), "int64", follows="boxes", max_len=2),
        "keypoints": Field.points((2, 3), max_len=2),
        "caption": Field.text(max_len=len("a picture, nº 6 ✓".encode())),
        "seg_mask": Field.mask(),
        "attrs": Field.numeric((3,), "float32"),
        "year": Field.numeric((), "int64"),
    }
)


def _write_jsonl(path, rows: list[dict], extra_lines: tuple[str, ...] = ()) -> str:
    lines = [json.dumps(r, ensure_ascii=False) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _write_csv(path, rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(list(rows[0]))
    for r in rows:
        w.writerow([json.dumps(v) if isinstance(v, list) else v for v in r.values()])
    path.write_text(buf.getvalue(), encoding="utf-8")
    return str(path)


def _check_set(manifest: str, root, rows: list[dict]) -> None:
    """Every record's fields equal its listing row's, through both readers."""
    with RecordIOReader(manifest, checksums=True) as r:
        assert r.schema == WANT
        assert len(r) == len(rows)
        read = r.reader(None, tuple(WANT.stored))
        for i, row in enumerate(rows):
            image, label, _key, fields = read(i)
            assert bytes(image) == (root / row["image"]).read_bytes()
            assert label == ["cat", "dog", "eel"].index(row["label"])
            _same_row(fields, row, root)
    src = RecordSource(manifest)
    assert src.schema == WANT
    read = src.reader(np.arange(len(rows)), tuple(WANT.stored))
    for i, row in enumerate(rows):
        payload, label, key, fields = read(i)
        assert key == i and label == ["cat", "dog", "eel"].index(row["label"])
        assert bytes(payload) == (root / row["image"]).read_bytes()
        _same_row(fields, row, root)
    src.close()


def _same_row(fields: dict, row: dict, root) -> None:
    assert set(fields) == set(WANT.stored)
    for name, f in WANT.stored.items():
        got = fields[name]
        if f.kind == "mask":
            assert got == (root / row[name]).read_bytes()
            assert decode_mask(got).shape == image_size((root / row["image"]).read_bytes())
        elif f.kind == "text":
            assert got == row[name]
        else:
            assert got.dtype == np.dtype(f.dtype), name
            want = np.asarray(row[name], dtype=f.dtype).reshape(got.shape)
            np.testing.assert_array_equal(got, want, err_msg=name)
            assert got.shape == (f.shape if f.kind == "numeric" else (len(row[name]), *f.shape))


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_listing_round_trips_every_field_kind(tmp_path, fmt) -> None:
    rows = _rows(tmp_path)
    listing = (_write_jsonl if fmt == "jsonl" else _write_csv)(tmp_path / f"l.{fmt}", rows)
    (tmp_path / "out").mkdir()
    report = pack(listing, tmp_path / "out" / "train", workers=2)
    assert report.written == N and report.rejected == 0
    m = load_manifest(report.manifest)
    assert m["classes"] == {"cat": 0, "dog": 1, "eel": 2}
    assert m["pack"]["source_kind"] == "listing"
    _check_set(report.manifest, tmp_path, rows)
    assert verify_records(report.manifest, decode=lambda b: None).ok


def test_jsonl_and_csv_of_the_same_rows_pack_the_same_bytes(tmp_path) -> None:
    rows = _rows(tmp_path, 4)
    a = pack(_write_jsonl(tmp_path / "l.jsonl", rows), tmp_path / "a", workers=1)
    b = pack(_write_csv(tmp_path / "l.csv", rows), tmp_path / "b", workers=1)
    assert (tmp_path / "a.rec").read_bytes() == (tmp_path / "b.rec").read_bytes()
    assert load_manifest(a.manifest)["schema"] == load_manifest(b.manifest)["schema"]


def test_a_given_schema_replaces_the_inference(tmp_path) -> None:
    rows = [
        {"path": "img/0.jpg", "label": 3, "scores": [0.5, 1.5], "blob": "AAEC", "ids": [7]},
        {"path": "img/1.jpg", "label": 1, "scores": [2.0, 3.0], "blob": "", "ids": [8, 9]},
    ]
    for i in range(2):
        write(str(tmp_path / "img" / f"{i}.jpg"), image_bytes(seed=i))
    schema = Schema(
        {
            "image": Field.image(),
            "label": Field.numeric((), "int64", header=True),
            "scores": Field.numeric((2,), "float64"),
            "blob": Field.bytes_(),
            "ids": Field.ragged((), "int32"),
        }
    )
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema.to_json()))
    listing = _write_jsonl(tmp_path / "l.jsonl", rows)
    r = pack(listing, tmp_path / "out", workers=1, schema=str(path))
    want = schema.with_max_len({"blob": 3, "ids": 2})
    with RecordIOReader(r.manifest) as rec:
        assert rec.schema == want
        read = rec.reader(None, tuple(want.stored))
        f0 = read(0)[3]
        assert f0["blob"] == base64.b64decode("AAEC") and f0["scores"].dtype == np.float64
        assert read(1)[3]["ids"].tolist() == [8, 9]
        assert read(1)[3]["ids"].dtype == np.int32
        assert read(0)[1] == 3.0


def test_inference_rules(tmp_path) -> None:
    """numeric vs ragged by row length, ragged following the one boxes field, points, empty
    lists, bbox naming, text vs mask by the key."""
    for i in range(3):
        write(str(tmp_path / f"{i}.jpg"), image_bytes(seed=i))
    rows = [
        {
            "image": f"{i}.jpg",
            "label": 0.5 * i,
            "bbox": [[0, 0, 4, 4]] * i,
            "scores": [0.1] * i,
            "tags": [1, 2, 3][: i + 1],
            "points": [[1, 2]] * 2,
            "empty": [],
            "note": "x" * i,
        }
        for i in range(3)
    ]
    r = pack(_write_jsonl(tmp_path / "l.jsonl", rows), tmp_path / "out", workers=1)
    with RecordIOReader(r.manifest) as rec:
        s = rec.schema
    assert s["label"] == Field.numeric((), "float32", header=True)
    assert s["bbox"].geometry == "boxes"
    assert s["scores"].follows == "bbox" and s["scores"].dtype == "float32"
    assert s["tags"].kind == "ragged" and s["tags"].follows is None and s["tags"].dtype == "int64"
    assert s["points"].kind == "ragged" and s["points"].geometry == "points"
    assert s["empty"].kind == "ragged" and s["empty"].max_len == 0
    assert s["note"].kind == "text"


def test_bad_rows_are_rejects_naming_the_line_and_field(tmp_path) -> None:
    rows = _rows(tmp_path, 4)
    bad = [
        {**rows[0], "boxes": [[1, 2, 3]], "classes": [1]},  # line 5: a box of 3 numbers
        {k: v for k, v in rows[1].items() if k != "caption"},  # line 6: caption missing
        {**rows[2], "seg_mask": "seg/nowhere.png"},  # line 7
        {**rows[3], "label": "whale"},  # line 8: a name in the listing is a class: stored
    ]
    listing = _write_jsonl(tmp_path / "l.jsonl", rows + bad, ("{not json",))
    r = pack(listing, tmp_path / "out", workers=1)
    assert r.written == 5 and r.rejected == 4
    rejects = (tmp_path / "out.rejects.tsv").read_text(encoding="utf-8")
    assert "line 5, field 'boxes': expects shape (n, 4)" in rejects
    assert "line 6, field 'caption': missing" in rejects
    assert "line 7, field 'seg_mask'" in rejects and "nowhere.png" in rejects
    assert "line 9: not JSON" in rejects
    assert load_manifest(r.manifest)["classes"]["whale"] == 3
    with pytest.raises(TooManyRejectsError, match="4 listing rows"):
        pack(listing, tmp_path / "again", workers=1, max_rejects=3)


def test_a_mask_that_does_not_fit_its_image_is_rejected(tmp_path) -> None:
    rows = _rows(tmp_path, 3)
    rows[1]["seg_mask"] = "seg/0.png"  # the mask of a narrower image
    write(str(tmp_path / "rgb.png"), image_bytes(fmt="PNG"))
    rows[2]["seg_mask"] = "rgb.png"
    r = pack(_write_jsonl(tmp_path / "l.jsonl", rows), tmp_path / "out", workers=1)
    rejects = (tmp_path / "out.rejects.tsv").read_text()
    assert r.written == 1
    assert "mask_size\tline 2: field 'seg_mask'" in rejects
    assert "bad_mask\tline 3: field 'seg_mask'" in rejects and "RGB" in rejects


def test_resize_is_refused_for_geometric_fields(tmp_path) -> None:
    listing = _write_jsonl(tmp_path / "l.jsonl", _rows(tmp_path, 2))
    with pytest.raises(PackError, match="resize"):
        pack(listing, tmp_path / "out", workers=1, resize=16)


def test_a_stopped_listing_run_resumes_to_a_clean_runs_bytes(tmp_path) -> None:
    rows = _rows(tmp_path)
    write(str(tmp_path / "img" / "empty.jpg"), b"")
    rows.insert(4, {**rows[0], "image": "img/empty.jpg"})
    listing = _write_jsonl(tmp_path / "l.jsonl", rows)
    (tmp_path / "clean").mkdir()
    pack(listing, tmp_path / "clean" / "out", workers=1)
    with pytest.raises(TooManyRejectsError):
        pack(listing, tmp_path / "out", workers=1, max_rejects=0)
    r = pack(listing, tmp_path / "out", workers=1)
    assert r.resumed == N and r.written == N  # the shard was written, and is kept
    for suffix in (".rec", ".idx", ".crc32c", ".stoker.json"):
        a = (tmp_path / "out").with_name("out" + suffix).read_bytes()
        b = (tmp_path / "clean" / ("out" + suffix)).read_bytes()
        assert a == b, suffix
    assert os.path.exists(tmp_path / "out.rejects.tsv")


def test_shards_hold_the_fields_of_their_records(tmp_path) -> None:
    rows = _rows(tmp_path)
    r = pack(_write_jsonl(tmp_path / "l.jsonl", rows), tmp_path / "out", workers=1, shard_size=3)
    assert len(r.shards) == 3
    _check_set(r.manifest, tmp_path, rows)
