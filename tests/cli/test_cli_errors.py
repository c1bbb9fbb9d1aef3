"""Every command's error is one line that names the argument and what to do, with no errno
text, traceback or usage block (issue 34, item 5): each command given a missing path, a file
where a folder is expected and the reverse, and an input of the wrong kind."""

from __future__ import annotations

import os
import re

import pytest

from stoker.cli import main

ARGS = ["--workers", "1", "--quiet"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A folder of images, its packed set, a listing, one image, a plain file and an empty
    folder, all under one root (the tests run in it, so the paths in messages are short)."""
    root = tmp_path_factory.mktemp("errors")
    images = root / "images"
    argv = ["sample-data", str(images), "--classes", "2", "--per-class", "2", "--size", "16"]
    assert main(argv) == 0
    assert main(["pack", str(images), str(root / "train"), *ARGS]) == 0
    (root / "train.jsonl").write_text('{"image": "images/class_00/00000.jpg", "label": 1}\n')
    (root / "afile").write_text("not a folder, not a set\n")
    (root / "adir").mkdir()
    return root


def one_line_error(capsys, argv: list[str], command: str) -> tuple[int, str]:
    """Run ``stoker ARGV``; its exit status and its stderr, checked to be one error line."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own refusals
        rc = int(e.code or 0)
    err = capsys.readouterr().err
    assert rc != 0, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"stoker {command}: error: "), line
    assert not re.search(r"\[Errno|Errno \d|Traceback|usage:", line), line
    assert "format=" not in line, line  # the flag is --format; format= is the Python API's
    return rc, line


# (command line, what the line must name: the argument and the advice)
CASES = {
    # a missing path
    "pack missing SRC": (["pack", "nothere", "out", *ARGS], ["SRC nothere", "no such file"]),
    "convert missing SRC": (
        ["convert", "nothere.stoker.json", "out", "--format", "wds", *ARGS],
        ["SRC nothere.stoker.json", "no such file", "check the path"],
    ),
    "inspect missing FILE": (
        ["inspect", "nothere.rec"],
        ["FILE nothere.rec", "no such file", "check the path"],
    ),
    "verify missing FILE": (["verify", "nothere"], ["FILE nothere", "no such file"]),
    "unpack missing FILE": (["unpack", "nothere", "out"], ["FILE nothere", "no such file"]),
    "doctor missing SOURCE": (["doctor", "nothere"], ["SOURCE nothere", "no such file"]),
    # a file where a folder is expected
    "unpack DIR is a file": (
        ["unpack", "train.stoker.json", "train.rec", "--quiet"],
        ["DIR train.rec is a file where a folder is expected", "give a folder"],
    ),
    "unpack DIR under a file": (
        ["unpack", "train.stoker.json", "afile/out", "--quiet"],
        ["DIR afile/out: ", "afile is a file where a folder is expected", "give a folder"],
    ),
    "sample-data DIR is a file": (
        ["sample-data", "train.rec", "--per-class", "1"],
        ["DIR train.rec is a file where a folder is expected", "give a folder"],
    ),
    "pack OUT under a file": (
        ["pack", "images", "afile/train", *ARGS],
        ["afile", "cannot create the output folder", "a file is in the way"],
    ),
    "convert OUT under a file": (
        ["convert", "train.stoker.json", "afile/t", "--format", "wds", *ARGS],
        ["afile", "cannot create the output folder", "a file is in the way"],
    ),
    # a folder where a file (a set) is expected
    "inspect FILE is an image folder": (
        ["inspect", "images"],
        ["FILE images is an image folder", "stoker pack images OUT"],
    ),
    "verify FILE is an empty folder": (
        ["verify", "adir"],
        ["FILE adir: cannot tell its format", "--format"],
    ),
    "unpack FILE is an image folder": (
        ["unpack", "images", "out"],
        ["FILE images is an image folder", "stoker pack images OUT"],
    ),
    "convert SRC is an image folder": (
        ["convert", "images", "out", "--format", "wds", *ARGS],
        ["SRC images is an image folder", "stoker pack images OUT"],
    ),
    # the wrong kind of input
    "pack SRC is a packed set": (
        ["pack", "train.rec", "out", *ARGS],
        ["SRC train.rec is a packed set", "stoker convert train.rec OUT"],
    ),
    "inspect FILE is a listing": (
        ["inspect", "train.jsonl"],
        ["FILE train.jsonl is a listing", "stoker pack train.jsonl OUT"],
    ),
    "verify FILE is one image": (
        ["verify", "images/class_00/00000.jpg"],
        ["FILE images/class_00/00000.jpg is one image", "stoker pack DIR OUT"],
    ),
    "unpack FILE is a listing": (
        ["unpack", "train.jsonl", "out"],
        ["FILE train.jsonl is a listing", "stoker pack train.jsonl OUT"],
    ),
    "convert SRC of no known format": (
        ["convert", "afile", "out", "--format", "wds", *ARGS],
        ["SRC afile: cannot tell its format", "--from"],
    ),
    "doctor SOURCE is a listing": (
        ["doctor", "train.jsonl"],
        ["SOURCE train.jsonl is a listing", "stoker pack train.jsonl OUT"],
    ),
    "doctor SOURCE of no known format": (
        ["doctor", "afile"],
        ["SOURCE afile: cannot tell its format", "manifest"],
    ),
    "sample-data --size not a size": (
        ["sample-data", "out", "--size", "big"],
        ["--size", "expected S or HxW", "see stoker sample-data --help"],
    ),
    "sample-data --classes out of range": (
        ["sample-data", "out", "--classes", "0"],
        ["--classes must be >= 1, got 0"],
    ),
    "doctor --batch-size out of range": (
        ["doctor", "images", "--batch-size", "0"],
        ["--batch-size must be >= 1, got 0"],
    ),
    "pack --shard-size out of range": (
        ["pack", "images", "out", "--shard-size", "0", *ARGS],
        ["--shard-size must be >= 1, got 0"],
    ),
    "cleanup takes no path": (
        ["cleanup", "afile"],
        ["unexpected arguments: afile", "see stoker cleanup --help"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_error_is_one_line_naming_the_argument_and_what_to_do(world, capsys, case):
    argv, wanted = CASES[case]
    cwd = os.getcwd()
    os.chdir(world)
    try:
        _, line = one_line_error(capsys, argv, argv[0])
    finally:
        os.chdir(cwd)
    for text in wanted:
        assert text in line, f"{case}: {text!r} not in {line!r}"
    assert not (world / "out").exists()  # refused before anything was written


def test_an_existing_output_folder_is_named_with_the_flag_that_replaces_it(world, capsys):
    """A plain OSError from deep inside a command (here EEXIST from a sample-data write into
    a folder that holds files) reaches the user as one line, not as errno text."""
    target = world / "full"
    target.mkdir(exist_ok=True)
    (target / "x.txt").write_text("x")
    _, line = one_line_error(
        capsys, ["sample-data", str(target), "--per-class", "1"], "sample-data"
    )
    assert str(target) in line and "--overwrite" in line


def test_a_file_in_the_way_of_an_output_names_the_flag_that_replaces_it(world, capsys):
    """The OSError of an O_EXCL open (a second unpack into the same folder) is one line: the
    argument, the file, and --overwrite."""
    out = str(world / "unpacked")
    assert main(["unpack", str(world / "train.stoker.json"), out, "--quiet"]) == 0
    _, line = one_line_error(capsys, ["unpack", str(world / "train.stoker.json"), out], "unpack")
    assert line.startswith(f"stoker unpack: error: DIR {out}: {out}/class_00/")
    assert line.endswith("already exists; pass --overwrite to replace it, or choose another path")
