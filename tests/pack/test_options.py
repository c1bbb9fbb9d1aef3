"""PackOptions: every option checked once, and its JSON views are the journal's settings and
the manifest's pack options."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle

import numpy as np
import pytest
from packhelp import make_tree, write

from stoker import TooManyRejectsError
from stoker.formats.recordio import load_manifest
from stoker.pack import PackOptions, pack
from stoker.pack.images import check_image
from stoker.pack.plan.plan import fingerprint, make_plan

WRONG_TYPE = [
    ("workers", "2"),
    ("resize", 1.5),
    ("quality", "90"),
    ("seed", None),
    ("seed", 1.0),
    ("shard_size", True),
    ("max_rejects", "1"),
    ("max_pixels", 1e6),
]
OUT_OF_RANGE = [
    ("workers", 0),
    ("resize", 0),
    ("quality", 0),
    ("quality", 101),
    ("seed", -1),
    ("shard_size", 0),
    ("max_rejects", -1),
    ("max_pixels", 0),
]


@pytest.mark.parametrize(("name", "value"), WRONG_TYPE)
def test_wrong_type_is_a_type_error_naming_the_option(tmp_path, name, value):
    with pytest.raises(TypeError, match=name):
        PackOptions(tmp_path, tmp_path / "out", **{name: value})
    with pytest.raises(TypeError, match=name):  # pack() checks through PackOptions
        pack(tmp_path, tmp_path / "out", **{name: value})


@pytest.mark.parametrize(("name", "value"), OUT_OF_RANGE)
def test_out_of_range_is_a_value_error_naming_the_option(tmp_path, name, value):
    with pytest.raises(ValueError, match=name):
        PackOptions(tmp_path, tmp_path / "out", **{name: value})


def test_out_must_name_a_prefix(tmp_path):
    with pytest.raises(ValueError, match="out must name a file prefix"):
        PackOptions(tmp_path, tmp_path)
    with pytest.raises(ValueError, match="out must name a file prefix"):
        PackOptions(tmp_path, "")


def test_normalised_frozen_and_picklable(tmp_path):
    opts = PackOptions(tmp_path, tmp_path / "out.rec", workers=np.int64(2), shuffle=1, root="")
    assert opts.src == str(tmp_path) and opts.out == str(tmp_path / "out.rec")
    assert opts.prefix == str(tmp_path / "out")
    assert type(opts.workers) is int and opts.shuffle is True and opts.root is None
    assert opts.check is check_image and opts.worker_count() == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(opts)) == opts  # what crosses to the workers


def test_journal_fingerprint_is_the_options_json(tmp_path):
    src = tmp_path / "src"
    make_tree(str(src), {"a": 2, "b": 2})
    write(str(src / "b" / "zero.jpg"), b"")
    out = tmp_path / "out"
    kw = {"shuffle": True, "seed": 5, "quality": 90, "max_rejects": 0, "workers": 1}
    with pytest.raises(TooManyRejectsError):  # stops with its journal in place
        pack(src, out, **kw)
    with open(f"{out}.pack-journal.partial") as f:
        journal = json.load(f)
    opts = PackOptions(src, out, **kw)
    assert journal["settings"] == opts.journal_json()
    assert opts.journal_json() == {
        "journal": 1,
        "resize": None,
        "quality": 90,
        "shuffle": True,
        "seed": 5,
        "shard_size": None,
        "max_pixels": 89_478_485,
        "check": "stoker.pack.images.check_image",
    }
    assert journal["fingerprint"] == fingerprint(make_plan(opts), opts.journal_json())


@pytest.mark.parametrize("from_lst", [False, True])
def test_manifest_pack_block_starts_with_the_options_json(tmp_path, from_lst):
    make_tree(str(tmp_path / "src"), {"a": 2})
    src = tmp_path / "src"
    if from_lst:
        src = tmp_path / "train.lst"
        src.write_text("4\t0\tsrc/a/img000.jpg\n2\t1\tsrc/a/img001.jpg\n")
    opts = PackOptions(src, tmp_path / "out", workers=1, shard_size=5, follow_symlinks=True)
    report = pack(src, tmp_path / "out", workers=1, shard_size=5, follow_symlinks=True)
    block = load_manifest(report.manifest)["pack"]
    head = dict(list(block.items())[: len(opts.manifest_json(from_lst=from_lst))])
    assert head == opts.manifest_json(from_lst=from_lst)
    assert list(head) == [
        "source",
        "source_kind",
        "keys",
        "resize",
        "quality",
        "shuffle",
        "seed",
        "shard_size",
        "max_pixels",
        "follow_symlinks",
    ]
    assert (head["source_kind"], head["keys"]) == (
        ("lst", "lst-index") if from_lst else ("folder", "position")
    )
    assert head["source"] == os.path.basename(src)
