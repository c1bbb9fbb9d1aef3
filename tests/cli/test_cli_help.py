"""A command line that helps (issue 20, item 6), as a user meets it: a mistyped option gets one
line naming the subcommand's closest options (the usage is --help's); a missing SRC is named as such; the output's
folder is created; a flat folder is refused with a hint, or packed with ``--labels none``;
``--json`` on every command that reports; ``import stoker.torch`` without torch says what to
install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from stoker.cli import COMMANDS, main
from stoker.formats.recordio.seam import RecordIOReader

ARGS = ["--workers", "1", "--quiet"]


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("help") / "images"
    args = ["sample-data", str(root), "--classes", "2", "--per-class", "3", "--size", "24"]
    assert main(args) == 0
    return str(root)


@pytest.fixture
def flat(images, tmp_path) -> str:
    """A folder of images with no class subfolder."""
    root = tmp_path / "flat"
    root.mkdir()
    for cls in ("class_00", "class_01"):
        for name in sorted(os.listdir(os.path.join(images, cls))):
            shutil.copy(os.path.join(images, cls, name), root / f"{cls}_{name}")
    return str(root)


def usage_error(capsys, argv: list[str]) -> str:
    """stderr of a command line argparse refuses (exit status 2): one line, no usage."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "usage:" not in err, err
    return err


# ---- unknown options and commands -------------------------------------------------------


def test_a_mistyped_option_gets_the_closest_option_and_the_subcommands_help(capsys, images):
    for argv in (["pack", "--workres", "2"], ["pack", "--workres", "2", images, "out"]):
        err = usage_error(capsys, argv)
        assert err.startswith(
            "stoker pack: error: unknown option --workres (did you mean --workers"
        )
        assert err.rstrip().endswith("see stoker pack --help"), err


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_refuses_an_unknown_option_itself(capsys, command):
    err = usage_error(capsys, [command, "--no-such-option"])
    assert err.startswith(f"stoker {command}: error: unknown option --no-such-option")
    assert f"see stoker {command} --help" in err


def test_option_spellings_argparse_takes_still_work(capsys, images, tmp_path):
    # a unique prefix (--work), --opt=value, and a negative number as a value
    out = str(tmp_path / "t")
    assert main(["pack", images, out, "--work", "1", "--seed=3", "--quiet"]) == 0
    assert main(["pack", images, out + "2", "--seed", "-1", *ARGS]) == 2
    err = capsys.readouterr().err
    assert "stoker pack: error: --seed must be >= 0, got -1" in err
    assert not os.path.exists(out + "2.rec")


def test_a_stray_argument_is_named(capsys, images, tmp_path):
    err = usage_error(capsys, ["verify", "a.stoker.json", "b.stoker.json"])
    assert err.startswith("stoker verify: error: unexpected arguments: b.stoker.json")


def test_a_mistyped_command_names_the_closest(capsys):
    err = usage_error(capsys, ["pakc", "a", "b"])
    assert "unknown command 'pakc' (did you mean pack" in err
    assert "commands: pack, convert" in err and "see stoker --help" in err


# ---- SRC, OUT and flat folders ----------------------------------------------------------


def test_a_missing_src_is_named_and_nothing_is_created(capsys, tmp_path):
    out = tmp_path / "new" / "x"
    assert main(["pack", str(tmp_path / "nonexistent"), str(out), *ARGS]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nonexistent'}: no such file or folder" in err
    assert "output folder" not in err
    assert not (tmp_path / "new").exists()
    assert main(["convert", str(tmp_path / "none.rec"), str(out), "--format", "wds"]) == 1
    assert "none.rec: no such file or folder" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_pack_and_convert_create_the_outputs_folder(images, tmp_path):
    out = tmp_path / "a" / "b" / "train"
    assert main(["pack", images, str(out), *ARGS]) == 0
    with RecordIOReader(f"{out}.stoker.json") as rec:
        assert len(rec) == 6
    wds = tmp_path / "c" / "d" / "train"
    assert main(["convert", f"{out}.stoker.json", str(wds), "--format", "wds", *ARGS]) == 0
    assert os.path.exists(f"{wds}.tar") and os.path.exists(f"{wds}.stoker.json")


def test_pack_names_a_file_in_the_way_of_the_outputs_folder(images, tmp_path, capsys):
    (tmp_path / "a").write_text("not a folder")
    assert main(["pack", images, str(tmp_path / "a" / "train"), *ARGS]) == 1
    assert "cannot create the output folder" in capsys.readouterr().err


def test_a_flat_folder_is_refused_with_a_hint(flat, tmp_path, capsys):
    out = tmp_path / "o" / "flat"
    assert main(["pack", flat, str(out), *ARGS]) == 1
    err = capsys.readouterr().err
    assert "6 images but no class subfolders" in err and "--labels none" in err
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_labels_none_packs_a_flat_folder_unlabelled(flat, tmp_path, capsys):
    out = str(tmp_path / "unlabelled")
    assert main(["pack", flat, out, "--labels", "none", "--workers", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["written"] == 6 and report["classes"] == {}
    with open(out + ".stoker.json") as f:
        manifest = json.load(f)
    assert manifest["pack"]["labels"] == "none" and manifest["classes"] == {}
    with RecordIOReader(out + ".stoker.json") as rec:
        assert rec.labels().tolist() == [0] * 6


def test_labels_none_labels_a_class_tree_zero_and_is_refused_for_a_list(images, tmp_path, capsys):
    out = str(tmp_path / "tree")
    assert main(["pack", images, out, "--labels", "none", *ARGS]) == 0
    with RecordIOReader(out + ".stoker.json") as rec:
        assert rec.labels().tolist() == [0] * 6 and not rec.manifest["classes"]
    lst = tmp_path / "x.lst"
    lst.write_text("0\t1\tclass_00/00000.jpg\n")
    args = ["pack", str(lst), str(tmp_path / "l"), "--root", images, "--labels", "none", *ARGS]
    assert main(args) == 1
    assert "carries its own labels" in capsys.readouterr().err


# ---- --json -----------------------------------------------------------------------------


def test_pack_json_is_the_report_alone_on_stdout(images, tmp_path, capsys):
    out = str(tmp_path / "j")
    assert main(["pack", images, out, "--workers", "1", "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["written"] == 6 and report["rejected"] == 0
    assert report["classes"] == {"class_00": 0, "class_01": 1}
    assert report["manifest"].endswith("j.stoker.json")


def test_verify_json_reports_counts_and_each_problem(images, tmp_path, capsys):
    out = str(tmp_path / "v")
    assert main(["pack", images, out, *ARGS]) == 0
    assert main(["verify", out + ".stoker.json", "--json", "--decode"]) == 0
    ok = json.loads(capsys.readouterr().out)
    assert ok["ok"] is True and ok["records"] == 6 and ok["decoded"] == 6
    assert ok["format"] == "recordio" and ok["problems"] == []
    with RecordIOReader(out + ".rec") as r:
        img = r.read(2)[0]
        offset = r.locate(2)[1] + 8 + 24 + len(img) // 2  # inside the third image's data
        key = r.key(2)
    with open(out + ".rec", "r+b") as f:
        f.seek(offset)
        f.write(b"\x00\x00\x00\x00")
    assert main(["verify", out + ".stoker.json", "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)
    assert bad["ok"] is False and bad["problem_count"] >= 1
    first = bad["problems"][0]
    assert first["key"] == key and "crc" in first["reason"].lower()
    assert first["path"].endswith("v.rec") and first["offset"] is not None


def test_convert_json(images, tmp_path, capsys):
    out = str(tmp_path / "c")
    assert main(["pack", images, out, *ARGS]) == 0
    dest = str(tmp_path / "c_wds")
    assert main(["convert", out + ".stoker.json", dest, "--format", "wds", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["written"] == 6 and report["format"] == "wds"


def test_import_stoker_torch_without_torch_says_what_to_install():
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if torch were not installed\n"
        "import stoker, stoker.pack\n"  # the rest of stoker imports without it
        "try:\n"
        "    import stoker.torch\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name); print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    name, message = proc.stdout.splitlines()[:2]
    assert name == "torch"
    assert "stoker.torch needs PyTorch: pip install 'stoker[torch]'" in message
