"""`stoker pack` of a listing whose rows cannot be stored: each such row is a reject naming its
line and field, never a traceback, and the other rows are packed (a lone surrogate, nesting
deep enough to exhaust ``json``'s recursion, a NUL in a path, a non-finite or out-of-int64
label, a key given twice, a label of the kind fewer rows give)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from packhelp import image_bytes, write

from stoker import pack
from stoker.formats.recordio import load_manifest
from stoker.formats.recordio.seam import RecordIOReader


def _images(root, n: int) -> list[str]:
    rels = []
    for i in range(n):
        rel = f"img/{i}.jpg"
        os.makedirs(root / "img", exist_ok=True)
        write(str(root / rel), image_bytes(seed=i))
        rels.append(rel)
    return rels


def _pack_cli(listing, out) -> tuple[subprocess.CompletedProcess, dict[int, str]]:
    """Run ``stoker pack LISTING OUT``; the process and its rejects by listing line."""
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "pack", str(listing), str(out), "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    rejects: dict[int, str] = {}
    tsv = str(out) + ".rejects.tsv"
    if os.path.exists(tsv):
        with open(tsv, encoding="utf-8") as f:
            for row in list(csv.reader(f, delimiter="\t"))[1:]:
                detail = row[3]
                rejects[int(detail.split(",")[0].split(":")[0].removeprefix("line "))] = detail
    return proc, rejects


def _labels(manifest: str) -> list:
    with RecordIOReader(manifest) as r:
        return r.labels().tolist()


def test_rows_that_cannot_be_stored_are_rejects_naming_line_and_field(tmp_path):
    rels = _images(tmp_path, 4)
    lines = [json.dumps({"image": rels[i % 4], "label": i % 3, "caption": "ok"}) for i in range(4)]
    lines += [
        # 5: a lone surrogate in the caption (cannot be stored as UTF-8)
        '{"image": "img/0.jpg", "label": 1, "caption": "a \\ud800 b"}',
        # 6: nested far past json's recursion limit
        '{"image": "img/1.jpg", "label": 1, "caption": "ok", "deep": '
        + "[" * 5000
        + "]" * 5000
        + "}",
        # 7: a NUL in the image path
        '{"image": "img/2\\u0000.jpg", "label": 1, "caption": "ok"}',
        # 8, 9: non-finite labels (Python's json reads NaN and Infinity)
        '{"image": "img/3.jpg", "label": NaN, "caption": "ok"}',
        '{"image": "img/3.jpg", "label": -Infinity, "caption": "ok"}',
        # 10: a class id outside int64 (read back as -2**63 if it were packed)
        '{"image": "img/3.jpg", "label": ' + str(2**70) + ', "caption": "ok"}',
        # 11: a key given twice
        '{"image": "img/3.jpg", "label": 1, "label": 2, "caption": "ok"}',
        # 12: a surrogate in a key of a nested object inside a list
        '{"image": "img/3.jpg", "label": 1, "caption": "ok", "deep": [{"\\udc80": 1}]}',
    ]
    listing = tmp_path / "l.jsonl"
    listing.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc, rejects = _pack_cli(listing, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert sorted(rejects) == list(range(5, 13))
    assert "field 'caption': text that is not valid Unicode" in rejects[5]
    assert "field 'deep': lists and objects nested deeper than 32" in rejects[6]
    assert "field 'image'" in rejects[7] and "NUL" in rejects[7]
    assert "field 'label': expects a finite number, got nan" in rejects[8]
    assert "field 'label': expects a finite number, got -inf" in rejects[9]
    assert f"field 'label': the class id {2**70} is outside int64" in rejects[10]
    assert "the key 'label' appears twice" in rejects[11]
    assert "field 'deep': text that is not valid Unicode" in rejects[12]
    m = load_manifest(str(tmp_path / "out.stoker.json"))
    assert m["records"] == 4
    assert _labels(str(tmp_path / "out.stoker.json")) == [0, 1, 2, 0]


def test_a_labels_kind_is_the_one_most_rows_give(tmp_path):
    rels = _images(tmp_path, 8)
    rows = [{"image": rels[i], "label": i} for i in range(7)] + [{"image": rels[7], "label": "cat"}]
    listing = tmp_path / "l.jsonl"
    listing.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    proc, rejects = _pack_cli(listing, tmp_path / "ints")
    assert proc.returncode == 0, proc.stderr
    assert list(rejects) == [8] and "expects a number as most rows give, got 'cat'" in rejects[8]
    m = load_manifest(str(tmp_path / "ints.stoker.json"))
    assert m["records"] == 7 and not m.get("classes")
    assert _labels(str(tmp_path / "ints.stoker.json")) == list(range(7))
    # and the other way round: most rows give a class name
    rows = [{"image": rels[i], "label": ["cat", "dog"][i % 2]} for i in range(7)]
    rows.append({"image": rels[7], "label": 3})
    listing.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    r = pack(str(listing), str(tmp_path / "names"), workers=1)
    assert r.written == 7 and r.rejected == 1
    assert load_manifest(r.manifest)["classes"] == {"cat": 0, "dog": 1}
    tsv = (tmp_path / "names.rejects.tsv").read_text(encoding="utf-8")
    assert "line 8, field 'label': expects a class name as most rows give" in tsv


def test_a_csv_label_of_nan_or_inf_is_a_reject_not_a_class_name(tmp_path):
    rels = _images(tmp_path, 6)
    listing = tmp_path / "l.csv"
    cells = ["0", "1", "nan", "2", "inf", "1"]
    listing.write_text(
        "image,label\n" + "".join(f"{p},{c}\n" for p, c in zip(rels, cells)), encoding="utf-8"
    )
    proc, rejects = _pack_cli(listing, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert sorted(rejects) == [4, 6]  # the header is line 1
    assert all("field 'label': expects a finite number" in d for d in rejects.values())
    m = load_manifest(str(tmp_path / "out.stoker.json"))
    assert not m.get("classes") and m["records"] == 4
    assert _labels(str(tmp_path / "out.stoker.json")) == [0, 1, 2, 1]


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_a_non_finite_label_in_an_im2rec_list_is_a_reject(tmp_path, bad):
    rels = _images(tmp_path, 3)
    lst = tmp_path / "l.lst"
    labels = ["0", bad, "1"]
    lst.write_text("".join(f"{i}\t{lab}\t{p}\n" for i, (lab, p) in enumerate(zip(labels, rels))))
    r = pack(str(lst), str(tmp_path / "out"), workers=1)
    assert r.written == 2 and r.rejected == 1
    tsv = (tmp_path / "out.rejects.tsv").read_text(encoding="utf-8")
    assert "line 2, field 'label'" in tsv and "not finite" in tsv
    assert np.isfinite(_labels(r.manifest)).all()


def test_csv_cells_that_cannot_be_stored_are_rejects_naming_line_and_field(tmp_path):
    rels = _images(tmp_path, 4)
    tags = ["[1, 2]", "[3]", "[" * 2000 + "]" * 2000, '["a \\ud800"]']
    listing = tmp_path / "l.csv"
    with open(listing, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f)
        out.writerow(["image", "label", "tags"])
        out.writerows([rel, i, tag] for i, (rel, tag) in enumerate(zip(rels, tags)))
    r = pack(str(listing), str(tmp_path / "out"), workers=1)
    assert r.written == 2 and r.rejected == 2
    tsv = (tmp_path / "out.rejects.tsv").read_text(encoding="utf-8")
    assert "line 4, field 'tags': lists and objects nested deeper than 32 levels" in tsv
    assert "line 5, field 'tags': text that is not valid Unicode" in tsv


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (json.dumps({"image": "a", "boxes": [[1, 2, 3, 4]] * 200}), None),  # many, shallow
        ('{"z": ' + "[" * 31 + "]" * 31 + "}", None),  # 32 levels: allowed
        ('{"z": ' + "[" * 32 + "]" * 32 + "}", "z"),  # 33
        ('{"a": 1, "y": ' + "[" * 5000, "y"),  # never closed: json would recurse all the same
        (json.dumps({"s": "[" * 100, "k": [1]}), None),  # brackets inside a string
        ('{"s": "\\\\\\"[[", "w": ' + "[" * 40 + "]" * 40 + "}", "w"),  # escapes before it
        ("[" * 40 + "]" * 40, ""),  # not under a key
    ],
)
def test_nesting_is_measured_outside_strings(text, key):
    from stoker.pack.plan.listing import _too_deep

    assert _too_deep(text) == key
