"""Sets the loader must refuse at open, with stoker's own error naming the file and the field or
line at fault: a manifest of an unknown ``format``, a schema shape no column could hold, a
``classes`` map with an id missing, a manifest naming a key twice, and a bare ``.rec`` whose
``.idx`` lists an offset twice (which would deliver one record twice), a shard file that a
symlink takes out of the set's folder."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from _recordio_util import payload, write_rec, write_shards

from stoker._core.errors import IndexFormatError, ManifestError
from stoker.cli import main
from stoker.loader import Loader
from stoker.pack import make_sample_data, pack


def _edited(mpath, edit) -> str:
    with open(mpath) as f:
        m = json.load(f)
    edit(m)
    out = os.path.join(os.path.dirname(mpath), "edited.stoker.json")
    with open(out, "w") as f:
        json.dump(m, f)
    return out


def _schema(m: dict) -> None:
    m["schema"] = {
        "version": 1,
        "fields": [
            {"name": "image", "kind": "image"},
            {
                "name": "label",
                "kind": "numeric",
                "dtype": "int64",
                "shape": [2**40],
                "header": True,
            },
        ],
    }


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m.update(format="stoker-parquet"), "format 'stoker-parquet' is not one stoker"),
        (_schema, r"fields\[1\] \(label\): a field's shape \(1099511627776,\) holds more than"),
        (lambda m: m.update(classes={"cat": 0, "emu": 2}), "class ids must be 0..C-1"),
    ],
    ids=["format", "shape", "classes"],
)
def test_the_loader_refuses_a_manifest_naming_it_and_the_field(tmp_path, edit, match):
    mpath, _ = write_shards(tmp_path, [3, 2])
    bad = _edited(str(mpath), edit)
    with pytest.raises(ManifestError, match=match) as e:
        Loader(bad, batch_size=2, workers=0)
    assert str(e.value).startswith(bad + ":")


def test_a_manifest_naming_a_key_twice_is_refused(tmp_path):
    mpath, _ = write_shards(tmp_path, [3])
    with open(mpath) as f:
        text = f.read()
    assert text.count('"records": 3') == 2  # the shard's and the total
    bad = text.replace('"version": 2', '"version": 2, "records": 99', 1)
    with open(mpath, "w") as f:
        f.write(bad)
    with pytest.raises(ManifestError, match="the key 'records' appears twice"):
        Loader(str(mpath), batch_size=2, workers=0)


def test_a_bare_rec_whose_idx_repeats_an_offset_is_refused(tmp_path):
    rec = write_rec(tmp_path, [payload(i, size=40) for i in range(4)], checksums=False)
    idx = rec[:-4] + ".idx"
    with open(idx) as f:
        lines = f.read().splitlines()
    key2, off1 = lines[2].split("\t")[0], lines[1].split("\t")[1]
    lines[2] = f"{key2}\t{off1}"  # line 3 points at line 2's record: it would be read twice
    with open(idx, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(IndexFormatError, match=f"{idx}, line 3: offset {off1} of key {key2}"):
        Loader(rec, batch_size=2, workers=0)


@pytest.fixture(scope="module")
def packed_sets(tmp_path_factory) -> dict[str, str]:
    """A set of 2 shards in each format stoker packs: its manifest."""
    root = tmp_path_factory.mktemp("linked")
    make_sample_data(root / "images", classes=2, per_class=3, size=24, workers=1)
    out = {}
    for fmt in ("recordio", "tfrecord", "wds"):
        pack(root / "images", root / fmt / "s", format=fmt, shard_size=3, workers=1,
             progress=False)  # fmt: skip
        out[fmt] = str(root / fmt / "s.stoker.json")
    return out


@pytest.mark.parametrize("fmt", ["recordio", "tfrecord", "wds"])
def test_a_shard_linked_from_outside_the_sets_folder_is_refused(tmp_path, capsys, packed_sets, fmt):
    """Pack refuses a link that leaves SRC (``outside_root``); a set refuses a shard file that
    a symlink takes out of its folder, at open and in verify. A link inside it reads."""
    src = os.path.dirname(packed_sets[fmt])
    here, away = tmp_path / "set", tmp_path / "away"
    shutil.copytree(src, here)
    away.mkdir()
    with open(packed_sets[fmt]) as f:
        data = json.load(f)["shards"][1]["files"]["data"]
    (here / "inside").mkdir()
    os.replace(here / data, here / "inside" / data)
    os.symlink(os.path.join("inside", data), here / data)  # a link inside the folder: read
    mpath = str(here / "s.stoker.json")
    with Loader(mpath, batch_size=6, workers=0) as ld:
        assert sum(len(b.keys) for b in ld) == 6
    os.replace(here / "inside" / data, away / data)
    os.remove(here / data)
    os.symlink(away / data, here / data)
    with pytest.raises(ManifestError, match="outside the set's folder") as e:
        Loader(mpath, batch_size=6, workers=0)
    assert str(here / data) in str(e.value) and str(away / data) in str(e.value)
    assert main(["verify", mpath, "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(away / data) in err and "outside the set's folder" in err
