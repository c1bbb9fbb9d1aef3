"""``stoker pack --format``: a folder, an im2rec list and a listing with fields packed into each
writable format and read back through ``stoker.formats.open`` (the same image bytes, labels,
keys, classes and fields); RecordIO stays what pack always wrote; rejects and resume work the
same in every format; label lists (paths confined to the listing's folder, label vectors)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from packhelp import image_bytes, make_tree, sha, write

import stoker.formats as formats
from stoker import TooManyRejectsError
from stoker._core.files import scan_folder
from stoker.pack import pack

FORMATS = ["recordio", "tfrecord", "wds"]


def read_all(path: str, fields: tuple[str, ...] = ()) -> list[tuple]:
    """``(image bytes, label, key, fields)`` of every sample, through the registry."""
    with formats.open(path) as r:
        f = r.reader(None, fields)
        out = []
        for i in range(len(r)):
            img, label, key, flds = f(i)
            out.append((bytes(img), np.asarray(label).tolist(), int(key), dict(flds)))
        return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("fmt") / "src")
    make_tree(root, {"ant": 5, "bee": 4, "cat": 3})
    write(os.path.join(root, "bee", "broken.jpg"), b"\xff\xd8 not really a jpeg")
    return root


def read_text(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("fmt", FORMATS)
def test_folder_packed_in_each_format_reads_back_the_same(tree, tmp_path, fmt):
    r = pack(tree, tmp_path / "out", workers=2, format=fmt, shard_size=5, progress=False)
    assert (r.written, r.rejected, r.format) == (12, 1, fmt)
    assert r.reasons == {"not_an_image": 1} and len(r.shards) == 3
    assert all(os.path.exists(s) for s in r.shards)
    m = json.loads(read_text(r.manifest))
    assert (m["format"], m["kind"], m["records"]) == ("stoker", fmt, 12)
    got = read_all(r.manifest)
    # the walk's order, keys by position; the broken file leaves a gap in the keys
    items = scan_folder(tree).items
    bad = next(k for k, it in enumerate(items) if it.rel == "bee/broken.jpg")
    want = []
    for k, it in enumerate(items):
        if k != bad:
            with open(it.path, "rb") as f:
                want.append((f.read(), int(it.label), k))
    assert [g[:2] for g in got] == [w[:2] for w in want]
    with formats.open(r.manifest) as reader:
        if fmt == "wds":  # WebDataset keys are member names; the reader numbers by position
            assert [reader.key_name(i) for i in range(len(reader))] == [f"{w[2]:09d}" for w in want]
        else:
            assert [g[2] for g in got] == [w[2] for w in want]
    with formats.open(r.manifest) as reader:
        assert reader.class_names == ["ant", "bee", "cat"]
        assert reader.labels().tolist() == [0] * 5 + [1] * 4 + [2] * 3
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


def test_recordio_is_the_default_and_unchanged(tree, tmp_path):
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "b")
    pack(tree, tmp_path / "a" / "out", workers=1, shard_size=4, progress=False)
    pack(tree, tmp_path / "b" / "out", workers=2, shard_size=4, progress=False, format="recordio")
    names = sorted(os.listdir(tmp_path / "a"))
    assert names == sorted(os.listdir(tmp_path / "b"))
    assert {n for n in names if n.endswith(".rec")} == {f"out-0000{s}.rec" for s in range(4)}
    for n in names:
        assert sha(tmp_path / "a" / n) == sha(tmp_path / "b" / n), n


def test_unknown_or_read_only_format_is_refused(tree, tmp_path):
    with pytest.raises(ValueError, match="unknown format 'parquet'"):
        pack(tree, tmp_path / "out", format="parquet")
    with pytest.raises(ValueError, match="read-only"):
        pack(tree, tmp_path / "out", format="lmdb")


@pytest.mark.parametrize("fmt", ["tfrecord", "wds"])
def test_existing_output_is_refused_then_overwritten(tree, tmp_path, fmt):
    from stoker import OutputExistsError

    pack(tree, tmp_path / "out", workers=1, format=fmt, progress=False)
    with pytest.raises(OutputExistsError, match="overwrite"):
        pack(tree, tmp_path / "out", workers=1, format=fmt, progress=False)
    r = pack(tree, tmp_path / "out", workers=1, format=fmt, progress=False, overwrite=True)
    assert r.written == 12


def _listing(root: str) -> str:
    rows = []
    for i in range(6):
        write(os.path.join(root, "img", f"{i}.jpg"), image_bytes((48, 40), seed=i))
        boxes = [[2.0 + j, 3.0, 20.0 + j, 30.0] for j in range(i % 3)]
        rows.append(
            {
                "image": f"img/{i}.jpg",
                "label": i % 2,
                "boxes": boxes,
                "classes": [j + 1 for j in range(i % 3)],
                "text": f"caption {i} é",
            }
        )
    path = os.path.join(root, "rows.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


@pytest.mark.parametrize("fmt", FORMATS)
def test_listing_with_fields_in_each_format(tmp_path, fmt):
    listing = _listing(str(tmp_path / "src"))
    r = pack(listing, tmp_path / "out", workers=1, format=fmt, progress=False)
    assert r.written == 6
    with formats.open(r.manifest) as reader:
        schema = reader.schema
        assert {"boxes", "classes", "text"} <= set(schema)
        assert schema["boxes"].geometry == "boxes" and schema["boxes"].max_len == 2
    got = read_all(r.manifest, ("boxes", "classes", "text"))
    for i, (img, label, key, flds) in enumerate(got):
        with open(tmp_path / "src" / "img" / f"{i}.jpg", "rb") as f:
            assert img == f.read()
        assert (label, key) == (i % 2, i)
        want = [[2.0 + j, 3.0, 20.0 + j, 30.0] for j in range(i % 3)]
        np.testing.assert_allclose(
            np.asarray(flds["boxes"]).reshape(-1, 4), np.reshape(want, (-1, 4)), rtol=1e-6
        )
        assert np.asarray(flds["classes"]).tolist() == [j + 1 for j in range(i % 3)]
        assert flds["text"] == f"caption {i} é"


@pytest.mark.parametrize("fmt", ["tfrecord", "wds"])
def test_stopped_run_resumes_to_a_clean_runs_bytes(tmp_path, fmt):
    src = str(tmp_path / "src")
    make_tree(src, {"a": 6, "b": 6})
    write(os.path.join(src, "b", "img003.jpg"), b"broken")  # position 9
    os.makedirs(tmp_path / "clean")
    clean = pack(
        src, tmp_path / "clean" / "out", workers=1, format=fmt, shard_size=5, progress=False
    )
    with pytest.raises(TooManyRejectsError, match="rerun to resume"):
        pack(
            src,
            tmp_path / "out",
            workers=1,
            format=fmt,
            shard_size=5,
            max_rejects=0,
            progress=False,
        )
    assert not os.path.exists(tmp_path / "out.stoker.json")
    assert [n for n in os.listdir(tmp_path) if n.endswith(".partial")]
    r = pack(src, tmp_path / "out", workers=1, format=fmt, shard_size=5, progress=False)
    assert r.resumed >= 5 and (r.written, r.rejected) == (11, 1)
    for s_clean, s_resumed in zip(clean.shards, r.shards, strict=True):
        assert os.path.basename(s_clean) == os.path.basename(s_resumed)
        assert sha(s_clean) == sha(s_resumed)
    assert read_all(r.manifest) == read_all(clean.manifest)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".partial")]


# ---------------------------------------------------------------- label lists (issue item 6)
def _rows(path: str, rows: list[dict]) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def test_listing_paths_resolve_against_its_folder_and_stay_inside_a_root_given(tmp_path):
    root = tmp_path / "data"
    write(str(root / "in" / "a.jpg"), image_bytes(seed=1))
    write(str(tmp_path / "outside.jpg"), image_bytes(seed=2))
    listing = _rows(
        str(root / "list.jsonl"),
        [
            {"path": "in/a.jpg", "label": 0},
            {"path": "../outside.jpg", "label": 1},
            {"path": str(tmp_path / "outside.jpg"), "label": 1},
        ],
    )
    os.chdir(tmp_path)  # relative to the listing's folder, not the working folder
    r0 = pack(listing, tmp_path / "out0", workers=1, progress=False)  # as written: all three
    assert (r0.written, r0.rejected) == (3, 0)
    r = pack(listing, tmp_path / "out", workers=1, progress=False, root=root)
    assert (r.written, r.rejected, r.reasons) == (1, 2, {"outside_root": 2})
    rows = read_text(r.rejects_path).splitlines()[1:]
    details = sorted(row.split("\t")[3] for row in rows)
    assert details[0].startswith("line 2, field 'path': ")
    assert details[1].startswith("line 3, field 'path': ")
    with open(root / "in" / "a.jpg", "rb") as f:
        assert read_all(r.manifest)[0][0] == f.read()
    r2 = pack(listing, tmp_path / "out2", workers=1, progress=False, root=root,
              allow_outside_root=True)  # fmt: skip
    assert (r2.written, r2.rejected) == (3, 0)


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
@pytest.mark.parametrize("fmt", ["recordio", "tfrecord"])
def test_path_plus_several_labels_is_a_label_vector(tmp_path, kind, fmt):
    vectors = [[1, 0, 1], [0, 0.5, 0], [1, 1, 1]]
    for i in range(3):
        write(str(tmp_path / f"{i}.jpg"), image_bytes(seed=i))
    if kind == "jsonl":
        listing = _rows(
            str(tmp_path / "l.jsonl"),
            [{"path": f"{i}.jpg", "label": v} for i, v in enumerate(vectors)],
        )
    else:
        listing = str(tmp_path / "l.csv")
        with open(listing, "w") as f:
            f.write("path,label\n")
            f.writelines(f'{i}.jpg,"{json.dumps(v)}"\n' for i, v in enumerate(vectors))
    r = pack(listing, tmp_path / "out", workers=1, format=fmt, progress=False)
    assert r.written == 3
    with formats.open(r.manifest) as reader:
        labels = reader.labels()
        assert labels.shape == (3, 3) and labels.dtype == np.float32
        np.testing.assert_array_equal(labels, np.asarray(vectors, np.float32))
    if fmt == "recordio":  # the IRHeader's several labels, as an im2rec list packs them
        from packhelp import header_of

        from stoker.formats.recordio.seam import RecordIOReader

        with RecordIOReader(r.manifest) as rec:
            h = header_of(rec, 1)
            assert h.flag == 3 and np.asarray(h.label).tolist() == [0, 0.5, 0]


def test_label_vector_of_the_wrong_length_is_a_reject_naming_its_line(tmp_path):
    for i in range(3):
        write(str(tmp_path / f"{i}.jpg"), image_bytes(seed=i))
    listing = _rows(
        str(tmp_path / "l.jsonl"),
        [
            {"path": "0.jpg", "label": [1, 0]},
            {"path": "1.jpg", "label": [1, 0, 1]},
            {"path": "2.jpg", "label": [0, 1]},
        ],
    )
    r = pack(listing, tmp_path / "out", workers=1, progress=False)
    assert (r.written, r.rejected) == (2, 1)
    row = read_text(r.rejects_path).splitlines()[1].split("\t")
    assert row[2] == "bad_field" and row[3].startswith("line 2, field 'label'")
