"""Sets the loader must refuse at open, with stoker's own error naming the file and the field or
line at fault: a manifest of an unknown ``format``, a schema shape no column could hold, a
``classes`` map with an id missing, a manifest naming a key twice, and a bare ``.rec`` whose
``.idx`` lists an offset twice (which would deliver one record twice)."""

from __future__ import annotations

import json
import os

import pytest
from _recordio_util import payload, write_rec, write_shards

from stoker._core.errors import IndexFormatError, ManifestError
from stoker.loader import Loader


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
