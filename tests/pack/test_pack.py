"""stoker.pack end to end, in process (faults.md B1 #1, #3, #13-#16; B2 #23-#25)."""

from __future__ import annotations

import errno
import json
import os

import numpy as np
import pytest
from packhelp import header_of, image_bytes, make_tree, set_digests, sha, write
from PIL import Image

from stoker import OutputExistsError, PackError, TooManyRejectsError
from stoker.codecs import decode
from stoker.formats.recordio import load_manifest, verify_records
from stoker.formats.recordio.seam import RecordIOReader
from stoker.pack import make_sample_data, pack
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.scan import unescape_name
from stoker.pack.run.worker import process


def read_text(path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def rejects_rows(report) -> list[list[str]]:
    lines = read_text(report.rejects_path).splitlines()
    assert lines[0] == "key\tpath\treason\tdetail"
    return [line.split("\t") for line in lines[1:]]


def outputs(prefix: str) -> dict[str, str]:
    return {
        ext: sha(prefix + ext)
        for ext in (".rec", ".idx", ".crc32c", ".stoker.json", ".rejects.tsv")
    }


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> str:
    return str(
        make_sample_data(tmp_path_factory.mktemp("sd") / "src", classes=3, per_class=40, size=32)
    )


def test_round_trip_and_counters(sample, tmp_path, capsys):  # B2 #25
    r = pack(sample, tmp_path / "out", workers=2, progress=True)
    err = capsys.readouterr().err
    assert "120/120" in err  # the bar finishes at the number of candidates
    assert r.written == 120 and r.rejected == 0 and r.ignored == 0  # the marker is not counted
    assert r.written + r.rejected + r.ignored == r.found
    assert r.passthrough == 120 and r.reencoded == 0
    assert verify_records(r.manifest).ok
    with RecordIOReader(r.manifest) as rec:
        assert len(rec) == 120 and rec.class_names == ["class_00", "class_01", "class_02"]
        assert rec.labels().tolist() == [0] * 40 + [1] * 40 + [2] * 40
        assert rec.keys().tolist() == list(range(120))
        img = rec.read(41)[0]
        with open(os.path.join(sample, "class_01", "00001.jpg"), "rb") as f:
            assert bytes(img) == f.read()  # original bytes, untouched
        assert header_of(rec, 41).id == 41
    m = load_manifest(r.manifest)
    assert m["pack"]["class_counts"] == {"class_00": 40, "class_01": 40, "class_02": 40}


def test_bytes_identical_for_any_worker_count(sample, tmp_path):  # B2 #24
    os.makedirs(tmp_path / "w1")
    os.makedirs(tmp_path / "w2")
    pack(sample, tmp_path / "w1" / "out", workers=1, shuffle=True, seed=3)
    pack(sample, tmp_path / "w2" / "out", workers=2, shuffle=True, seed=3)
    assert outputs(str(tmp_path / "w1" / "out")) == outputs(str(tmp_path / "w2" / "out"))
    with RecordIOReader(str(tmp_path / "w2" / "out.rec")) as rec:
        labels = rec.labels()
    assert sorted(labels.tolist()) == [0.0] * 40 + [1.0] * 40 + [2.0] * 40
    assert labels.tolist() != sorted(labels.tolist())  # shuffled


def test_shards_and_list_file(sample, tmp_path):
    r = pack(sample, tmp_path / "out", workers=2, shard_size=50, list_file=True)
    assert [os.path.basename(s) for s in r.shards] == [
        "out-00000.rec",
        "out-00001.rec",
        "out-00002.rec",
    ]
    with RecordIOReader(r.manifest) as rec:
        assert len(rec) == 120
    lines = read_text(r.list_path).splitlines()
    assert lines[0] == "0\t0.000000\tclass_00/00000.jpg" and len(lines) == 120
    assert verify_records(r.manifest).ok


def test_bad_files_rejected_listed_and_rest_packed(tmp_path):  # B1 #1, #3, #7
    src = tmp_path / "src"
    make_tree(str(src), {"a": 3, "b": 3})
    write(str(src / "a" / "empty.jpg"), b"")
    write(str(src / "b" / "png_named.JPEG"), image_bytes((24, 20), fmt="PNG"))
    good = image_bytes((32, 32))
    write(str(src / "b" / "cut.jpg"), good[: len(good) // 2])
    write(str(src / "b" / "readme.txt"), b"not an image")
    r = pack(src, tmp_path / "out", workers=2)
    assert (r.found, r.written, r.rejected, r.ignored) == (10, 7, 2, 1)
    rows = rejects_rows(r)
    assert sorted((row[1], row[2]) for row in rows) == [
        ("a/empty.jpg", "empty"),
        ("b/cut.jpg", "truncated"),
    ]
    assert r.formats == {"JPEG": 6, "PNG": 1}
    with RecordIOReader(r.manifest) as rec:
        keys = rec.keys().tolist()
        assert len(keys) == 7
        empty_key = int(next(row[0] for row in rows if row[2] == "empty"))
        assert empty_key not in keys  # a gap where the reject was
        shapes = {tuple(decode(rec.read(i)[0]).shape) for i in range(len(rec))}
    assert shapes == {(32, 32, 3), (20, 24, 3)}


def test_empty_class_and_bad_only_class_keep_ids(tmp_path):  # B1 #16
    a = tmp_path / "a"
    make_tree(str(a), {"x": 2, "z": 2})
    os.makedirs(a / "y")  # empty class
    b = tmp_path / "b"
    make_tree(str(b), {"x": 2, "z": 2})
    write(str(b / "y" / "bad.jpg"), b"")  # class with only bad files
    ra = pack(a, tmp_path / "ra", workers=1)
    rb = pack(b, tmp_path / "rb", workers=1)
    assert ra.classes == rb.classes == {"x": 0, "y": 1, "z": 2}
    with RecordIOReader(ra.manifest) as r1, RecordIOReader(rb.manifest) as r2:
        assert r1.labels().tolist() == r2.labels().tolist() == [0, 0, 2, 2]
    assert load_manifest(rb.manifest)["pack"]["class_counts"]["y"] == 0


def test_odd_names_survive(tmp_path):  # B1 #15
    src = os.fsencode(tmp_path / "src")
    os.makedirs(src + b"/cl\xe9")
    names = [b"a\tb\n.jpg", b"caf\xe9.jpg"]
    for i, n in enumerate(names):
        write(os.fsdecode(src + b"/cl\xe9/" + n), image_bytes(seed=i))
    write(os.fsdecode(src + b"/cl\xe9/tab\tempty.jpg"), b"")
    r = pack(os.fsdecode(src), tmp_path / "out", workers=1, list_file=True)
    assert r.written == 2 and r.rejected == 1
    m = load_manifest(r.manifest)
    assert [os.fsencode(k) for k in m["classes"]] == [b"cl\xe9"]
    lst = read_text(r.list_path).split("\n")
    assert lst[-1] == "" and len(lst) == 3
    listed = sorted(os.fsencode(unescape_name(line.split("\t")[2])) for line in lst[:-1])
    assert listed == sorted(b"cl\xe9/" + n for n in names)
    (row,) = rejects_rows(r)
    assert os.fsencode(unescape_name(row[1])) == b"cl\xe9/tab\tempty.jpg"
    with open(r.shards[0][:-4] + ".idx", "rb") as f:
        assert f.read().count(b"\n") == 2


def test_vanished_between_listing_and_reading(tmp_path, monkeypatch):  # B1 #14
    import stoker.pack.plan.plan as plan

    src = tmp_path / "src"
    make_tree(str(src), {"a": 4})
    real = plan.scan_folder

    def scan_then_delete(*args, **kw):
        res = real(*args, **kw)
        os.unlink(src / "a" / "img002.jpg")
        return res

    monkeypatch.setattr(plan, "scan_folder", scan_then_delete)
    r = pack(src, tmp_path / "out", workers=1)
    assert r.written == 3 and r.reasons == {"vanished": 1}
    assert rejects_rows(r)[0][1:3] == ["a/img002.jpg", "vanished"]


def test_unreadable_file_rejected(tmp_path, monkeypatch):  # B1 #13
    path = write(str(tmp_path / "a" / "x.jpg"), image_bytes())
    opts = PackOptions(tmp_path, tmp_path / "out")
    if os.geteuid() != 0:  # root reads mode-000 files; the patched variant below always runs
        os.chmod(path, 0)
        try:
            assert process(path, opts)[:2] == (1, "EACCES")
        finally:
            os.chmod(path, 0o644)
    real_open = os.open

    def deny(p, *a, **kw):
        if os.fspath(p) == path:
            raise PermissionError(errno.EACCES, "Permission denied", p)
        return real_open(p, *a, **kw)

    monkeypatch.setattr(os, "open", deny)
    assert process(path, opts)[:2] == (1, "EACCES")
    assert process(str(tmp_path / "missing.jpg"), opts)[:2] == (1, "vanished")


def test_refuses_existing_outputs(sample, tmp_path):  # B2 #23
    r = pack(sample, tmp_path / "out", workers=1)
    before = sha(r.shards[0])
    with pytest.raises(OutputExistsError, match="overwrite"):
        pack(sample, tmp_path / "out", workers=1)
    # a failed overwrite leaves the old files intact
    bad = tmp_path / "bad"
    make_tree(str(bad), {"a": 2})
    write(str(bad / "a" / "zero.jpg"), b"")
    with pytest.raises(TooManyRejectsError):
        pack(bad, tmp_path / "out", workers=1, overwrite=True, max_rejects=0)
    assert sha(r.shards[0]) == before and verify_records(r.manifest).ok
    r2 = pack(bad, tmp_path / "out", workers=1, overwrite=True)
    assert r2.written == 2 and verify_records(r2.manifest).ok


def test_max_rejects_writes_the_list_then_fails(tmp_path):
    src = tmp_path / "src"
    make_tree(str(src), {"a": 3})
    for i in range(3):
        write(str(src / "a" / f"zero{i}.jpg"), b"")
    with pytest.raises(TooManyRejectsError, match="rejects.tsv"):
        pack(src, tmp_path / "out", workers=1, max_rejects=1)
    assert not os.path.exists(tmp_path / "out.stoker.json")  # no set: the shard is not named
    rows = read_text(tmp_path / "out.rejects.tsv").splitlines()
    assert len(rows) == 1 + 3 and all("empty" in row for row in rows[1:])  # every reject
    r = pack(src, tmp_path / "out", workers=1, max_rejects=3, overwrite=True)
    assert r.written == 3 and r.rejected == 3


def _mixed_tree(src) -> None:
    """As-is JPEGs, PNGs with alpha (re-encoded), EXIF-rotated JPEGs, one empty file between."""
    from PIL import Image as PILImage

    make_tree(str(src), {"a": 5})
    for i in range(4):
        write(str(src / "b" / f"p{i}.png"), image_bytes(fmt="PNG", mode="RGBA", seed=i))
    write(str(src / "b" / "p2zero.png"), b"")  # sorts between p2 and p3
    exif = PILImage.Exif()
    exif[0x0112] = 6
    for i in range(3):
        write(str(src / "c" / f"r{i}.jpg"), image_bytes(seed=9 + i, exif=exif.tobytes()))


@pytest.mark.parametrize("shard_size", [None, 5])
def test_resumed_manifest_equals_a_clean_runs(tmp_path, shard_size):
    """A run stopped before its manifest (here by max_rejects) and resumed counts the records
    of the shards it keeps too: the manifest equals a clean run's byte for byte."""
    src = tmp_path / "src"
    _mixed_tree(src)
    (tmp_path / "clean").mkdir()
    clean = pack(src, tmp_path / "clean" / "out", workers=1, shard_size=shard_size)
    assert (
        clean.passthrough == 5
        and clean.reencoded == 7
        and clean.formats
        == {
            "JPEG": 8,
            "PNG": 4,
        }
    )
    out = tmp_path / "out"
    with pytest.raises(TooManyRejectsError):
        pack(src, out, workers=1, max_rejects=0, shard_size=shard_size)
    r = pack(src, out, workers=1, shard_size=shard_size)
    assert r.resumed == 12  # every shard was written, and is kept
    assert (r.passthrough, r.reencoded, r.formats) == (5, 7, {"JPEG": 8, "PNG": 4})
    assert r.bytes_in == clean.bytes_in
    assert set_digests(str(out)) == set_digests(str(tmp_path / "clean" / "out"))
    pack_block = load_manifest(r.manifest)["pack"]
    assert (pack_block["exif_rotated"], pack_block["written"]) == (3, 12)


def test_resize_reencodes(sample, tmp_path):
    r = pack(sample, tmp_path / "out", workers=2, resize=16, quality=80)
    assert r.reencoded == 120 and r.passthrough == 0
    with RecordIOReader(r.manifest) as rec:
        assert decode(rec.read(7)[0]).shape == (16, 16, 3)


def test_lst_input_keeps_its_keys_and_labels(tmp_path):
    root = tmp_path / "imgs"
    write(str(root / "p.jpg"), image_bytes(seed=1))
    write(str(root / "q.jpg"), image_bytes(seed=2))
    lst = tmp_path / "train.lst"
    lst.write_text("10\t4\tp.jpg\n3\t1\t2.5\tq.jpg\n")
    r = pack(lst, tmp_path / "out", workers=1, root=root)
    assert r.written == 2
    with RecordIOReader(r.shards[0]) as rec:
        assert rec.keys().tolist() == [10, 3]
        assert header_of(rec, 0).label == 4.0
        assert header_of(rec, 1).label.tolist() == [1.0, 2.5]


def test_lst_paths_stay_inside_root_unless_allowed(tmp_path):
    root = tmp_path / "imgs"
    write(str(root / "p.jpg"), image_bytes(seed=1))
    secret = write(str(tmp_path / "secret.jpg"), image_bytes(seed=2))
    lst = tmp_path / "train.lst"
    lst.write_text(f"0\t0\tp.jpg\n1\t0\t../secret.jpg\n2\t0\t{secret}\n3\t0\tnone.jpg\n")
    r = pack(lst, tmp_path / "out", workers=1, root=root)
    assert r.written == 1 and r.found == 4
    assert r.reasons == {"missing": 1, "outside_root": 2}
    rows = [row[1:3] for row in rejects_rows(r)]
    assert rows == [["../secret.jpg", "outside_root"], [secret, "outside_root"]] + [
        ["none.jpg", "missing"]
    ]
    assert load_manifest(r.manifest)["rejects"]["reasons"] == r.reasons
    r = pack(lst, tmp_path / "all", workers=1, root=root, allow_outside_root=True)
    assert r.written == 3 and r.reasons == {"missing": 1}
    with RecordIOReader(r.manifest) as rec:
        assert rec.keys().tolist() == [0, 1, 2]


def test_bad_arguments(tmp_path, sample):
    with pytest.raises(ValueError, match="workers"):
        pack(sample, tmp_path / "o", workers=0)
    with pytest.raises(ValueError, match="quality"):
        pack(sample, tmp_path / "o", quality=101)
    with pytest.raises(PackError, match="no such file"):
        pack(tmp_path / "nope", tmp_path / "o")
    pack(sample, tmp_path / "no" / "dir" / "o", workers=1)  # the output's folders are made
    assert (tmp_path / "no" / "dir" / "o.stoker.json").is_file()


def test_write_failure_names_the_output_and_removes_partials(
    sample, tmp_path, monkeypatch
):  # B2 #22
    from stoker.formats.recordio import RecordWriter

    real = RecordWriter.write
    calls = {"n": 0}

    def full_disk(self, key, payload):
        calls["n"] += 1
        if calls["n"] > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, key, payload)

    monkeypatch.setattr(RecordWriter, "write", full_disk)
    with pytest.raises(PackError, match=r"out\.rec.*ENOSPC"):
        pack(sample, tmp_path / "out", workers=1)
    assert sorted(os.listdir(tmp_path)) == []


def test_manifest_pack_section_is_json(sample, tmp_path):
    r = pack(sample, tmp_path / "out", workers=1)
    m = json.loads(read_text(r.manifest))
    assert m["pack"]["keys"] == "position" and m["rejects"]["count"] == 0
    assert m["pack"]["exif_rotated"] == 0 and m["pack"]["passthrough"] == 120
    assert np.isfinite(r.images_per_s) and "images/s" in r.summary()


def test_pnm_and_upper_case_gif_are_packed(tmp_path):
    src = tmp_path / "src"
    write(str(src / "a" / "rgb.ppm"), image_bytes((20, 16), fmt="PPM", seed=1))
    write(str(src / "a" / "gray.pgm"), image_bytes((20, 16), fmt="PPM", mode="L", seed=2))
    write(str(src / "b" / "anim.GIF"), image_bytes((20, 16), fmt="GIF", seed=3))
    r = pack(src, tmp_path / "out", workers=1)
    assert (r.found, r.written, r.rejected, r.ignored) == (3, 3, 0, 0)
    assert r.formats == {"GIF": 1, "PNM": 2} and r.reencoded == 3
    with RecordIOReader(r.manifest) as rec:
        for i, name in enumerate(["a/gray.pgm", "a/rgb.ppm", "b/anim.GIF"]):
            with Image.open(src / name) as im:
                ref = np.asarray(im.convert("RGB"))
            assert np.array_equal(decode(rec.read(i)[0]), ref), name


def test_hidden_names_are_ignored(tmp_path):
    src = tmp_path / "src"
    make_tree(str(src), {"a": 2})
    write(str(src / "a" / ".hidden.jpg"), image_bytes())
    write(str(src / "a" / "._img000.jpg"), b"\x00\x05\x16\x07 AppleDouble")
    write(str(src / ".ipynb_checkpoints" / "x.jpg"), image_bytes())
    r = pack(src, tmp_path / "out", workers=1)
    assert r.classes == {"a": 0}
    assert (r.found, r.written, r.rejected, r.ignored) == (5, 2, 0, 3)
