"""`stoker pack | inspect | verify | unpack | sample-data`: exit codes, messages, round trips
(faults.md B9 #80 for unpack)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from stoker.cli import main
from stoker.formats.recordio.seam import RecordIOReader

ARGS = ["--workers", "1", "--quiet"]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("cli") / "images"
    assert (
        main(["sample-data", str(root), "--classes", "3", "--per-class", "8", "--size", "32"]) == 0
    )
    return str(root)


@pytest.fixture
def packed(images, tmp_path) -> str:
    out = str(tmp_path / "train")
    assert main(["pack", images, out, *ARGS]) == 0
    return out


def test_sample_data_makes_the_folder(images, capsys, tmp_path):
    files = sorted(
        os.path.relpath(os.path.join(d, f), images)
        for d, _, fs in os.walk(images)
        for f in fs
        if f.endswith(".jpg")
    )
    assert len(files) == 24 and files[0] == "class_00/00000.jpg"
    assert (
        main(
            [
                "sample-data",
                str(tmp_path / "s"),
                "--classes",
                "2",
                "--per-class",
                "3",
                "--size",
                "24x40",
            ]
        )
        == 0
    )
    assert "6 images in 2 classes" in capsys.readouterr().out
    # a folder with other content is refused
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("x")
    assert main(["sample-data", str(tmp_path / "busy")]) == 1
    assert "overwrite" in capsys.readouterr().err


def test_pack_prints_a_summary(images, tmp_path, capsys):
    assert main(["pack", images, str(tmp_path / "t"), "--workers", "2", "--list"]) == 0
    out = capsys.readouterr().out
    assert "packed 24 images" in out and "images/s" in out and "MB/s" in out
    # the note sample-data leaves at the root (.stoker-sample.json) is not counted as ignored
    assert "found 24: written 24, rejected 0, ignored 0" in out
    assert os.path.exists(tmp_path / "t.lst") and os.path.exists(tmp_path / "t.crc32c")


def test_pack_refuses_existing_output(images, packed, capsys):
    assert main(["pack", images, packed, *ARGS]) == 1
    err = capsys.readouterr().err
    assert "train.rec exists" in err and "--overwrite" in err
    assert main(["pack", images, packed, *ARGS, "--overwrite"]) == 0


def test_pack_max_rejects_exit_1_and_names_the_list(images, tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(images, src)
    (src / "class_01" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    assert main(["pack", str(src), str(tmp_path / "o"), *ARGS, "--max-rejects", "0"]) == 1
    err = capsys.readouterr().err
    assert "max_rejects=0" in err and "o.rejects.tsv" in err
    rows = (tmp_path / "o.rejects.tsv").read_text().splitlines()
    assert rows[1].split("\t")[1] == "class_01/broken.jpg"
    assert main(["pack", str(src), str(tmp_path / "o"), "--workers", "1"]) == 0  # resumes
    out = capsys.readouterr().out
    assert "rejected 1 (" in out and "o.rejects.tsv" in out


def test_pack_bad_source(tmp_path, capsys):
    assert main(["pack", str(tmp_path / "missing"), str(tmp_path / "o"), *ARGS]) == 1
    assert "no such file or folder" in capsys.readouterr().err


def test_pack_lst_outside_root_flag(images, tmp_path):
    cls, other = sorted(d for d in os.listdir(images) if not d.startswith("."))[:2]
    name = sorted(os.listdir(os.path.join(images, cls)))[0]
    name2 = sorted(os.listdir(os.path.join(images, other)))[0]
    lst = tmp_path / "list.lst"
    lst.write_text(f"0\t0\t{name}\n1\t0\t../{other}/{name2}\n")
    root = os.path.join(images, cls)
    out = str(tmp_path / "o")
    assert main(["pack", str(lst), out, "--root", root, *ARGS]) == 0
    with open(out + ".rejects.tsv") as f:
        assert f.read().splitlines()[1].split("\t")[1:3] == [f"../{other}/{name2}", "outside_root"]
    args = ["pack", str(lst), out + "2", "--root", root, "--allow-outside-root", *ARGS]
    assert main(args) == 0
    with RecordIOReader(out + "2.stoker.json") as rec:
        assert rec.keys().tolist() == [0, 1]


def _absolute_listing(images, folder) -> str:
    """A listing as scripts write them: one row per image, its absolute path and a label."""
    rows = [
        {"path": os.path.join(d, f), "label": int(os.path.basename(d).split("_")[-1])}
        for d, _, fs in sorted(os.walk(images))
        for f in sorted(fs)
        if f.endswith(".jpg")
    ]
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "rows.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def test_a_listing_of_absolute_paths_packs_every_row_and_root_confines(images, tmp_path, capsys):
    listing = _absolute_listing(images, tmp_path / "meta")
    out = str(tmp_path / "o")
    assert main(["pack", listing, out, *ARGS]) == 0
    with RecordIOReader(out + ".stoker.json") as rec:
        assert len(rec) == 24
    # --root asks for confinement: every row lies outside it, so nothing is packed
    capsys.readouterr()
    argv = ["pack", listing, out + "2", "--root", str(tmp_path / "meta"), *ARGS]
    assert main(argv) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert "nothing packed: all 24 files were rejected, 24 of them outside_root" in line
    assert "--allow-outside-root" in line and "allow_outside_root=True" not in line
    assert not os.path.exists(out + "2.stoker.json")
    assert main([*argv[:2], out + "3", *argv[3:], "--allow-outside-root"]) == 0


def test_a_pack_whose_every_row_fails_names_the_reason_and_its_fix(tmp_path):
    from stoker import TooManyRejectsError
    from stoker.pack import pack

    listing = tmp_path / "meta" / "rows.jsonl"
    listing.parent.mkdir()
    listing.write_text(
        "".join(json.dumps({"path": f"img/{i}.jpg", "label": 0}) + "\n" for i in range(3))
    )
    with pytest.raises(TooManyRejectsError) as e:
        pack(listing, tmp_path / "o", workers=1, progress=False)
    text = str(e.value)
    assert "all 3 files were rejected, 3 of them missing" in text
    assert "root= (--root)" in text and "the listing's folder" in text and "\n" not in text


def test_inspect_text_and_json(packed, capsys):
    assert main(["inspect", packed + ".stoker.json"]) == 0
    text = capsys.readouterr().out
    assert "records:       24 in 1 shard(s)" in text and "classes:       3" in text
    assert "JPEG 24" in text
    assert main(["inspect", packed + ".rec", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["records"] == 24 and info["classes"] == 3
    assert info["labels"]["distinct"] == 3 and info["labels"]["per_label"]["min"] == 8
    assert info["images"]["height"]["max"] == 32 and info["images"]["formats"] == {"JPEG": 24}
    assert info["per_class"] == {"class_00": 8, "class_01": 8, "class_02": 8}


def test_verify_ok_then_reports_corruption(packed, capsys):
    assert main(["verify", packed + ".stoker.json", "--decode"]) == 0
    assert "OK" in capsys.readouterr().out
    with RecordIOReader(packed + ".rec") as r:
        off = r.locate(5)[1]
        key = r.key(5)
    with open(packed + ".rec", "r+b") as f:  # flip one bit of record 5's magic
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 1]))
    assert main(["verify", packed + ".rec", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert f"key {key}" in out and f"byte offset {off}" in out


def test_verify_checksums_and_decode(packed, capsys):
    with RecordIOReader(packed + ".rec") as r:
        img = r.read(3)[0]
        off = r.locate(3)[1] + 8 + 24 + len(img) // 2  # inside the JPEG entropy data
    with open(packed + ".rec", "r+b") as f:
        f.seek(off)
        f.write(b"\x00\x00\x00\x00")
    assert main(["verify", packed + ".rec", "--quiet"]) == 1
    assert "crc" in capsys.readouterr().out.lower()
    assert main(["verify", packed + ".rec", "--quiet", "--no-checksums"]) == 0


def test_unpack_round_trips_original_bytes(images, packed, tmp_path, capsys):
    out = tmp_path / "unpacked"
    assert main(["unpack", packed + ".stoker.json", str(out)]) == 0
    assert "wrote 24 images" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["class_00", "class_01", "class_02"]
    # passthrough: the bytes are the original files'
    with open(os.path.join(images, "class_01", "00001.jpg"), "rb") as f:
        assert (out / "class_01" / "9.jpg").read_bytes() == f.read()
    assert main(["unpack", packed + ".rec", str(out)]) == 1  # files exist
    assert "exists" in capsys.readouterr().err
    assert main(["unpack", packed + ".rec", str(out), "--overwrite", "--quiet"]) == 0


@pytest.mark.parametrize(
    "evil", ["../../escaped", "a/b", "/abs", "..", "nul\x00byte", "back\\slash"]
)
def test_unpack_refuses_escaping_class_names(packed, tmp_path, capsys, evil):  # B9 #80
    mpath = packed + ".stoker.json"
    with open(mpath) as f:
        m = json.load(f)
    m["classes"] = {evil: 0, "ok1": 1, "ok2": 2}
    with open(mpath, "w") as f:
        json.dump(m, f)
    dest = tmp_path / "deep" / "dest"
    assert main(["unpack", mpath, str(dest)]) == 1
    assert "refusing class name" in capsys.readouterr().err
    assert not dest.exists() or not any(dest.rglob("*"))
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "deep" / "escaped").exists()


def test_console_entry_point_runs(images, tmp_path):
    out = str(tmp_path / "sub")
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "pack", images, out, "--workers", "2", "--quiet"],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    proc = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "verify", out + ".rec", "--quiet"],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout.decode()


def test_a_listing_with_numeric_labels_reports_its_distinct_labels(images, tmp_path, capsys):
    """A JSONL whose labels are numbers has no class names: pack counts its distinct labels
    as inspect does, instead of "classes 0"."""
    rows = [("class_00/00000.jpg", 0), ("class_00/00001.jpg", 1), ("class_01/00000.jpg", 2)]
    rows.append(("class_01/00001.jpg", 2))
    listing = tmp_path / "train.jsonl"
    listing.write_text("".join(json.dumps({"image": p, "label": y}) + "\n" for p, y in rows))
    out = str(tmp_path / "ints")
    assert main(["pack", str(listing), out, "--root", images, "--workers", "1"]) == 0
    summary = capsys.readouterr().out
    assert "labels 3 distinct (no class names)" in summary and "classes 0" not in summary
    assert main(["inspect", out + ".stoker.json"]) == 0
    assert "3 distinct" in capsys.readouterr().out
