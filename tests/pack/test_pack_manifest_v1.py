"""A pack started by a release that wrote version-1 manifests finishes after an upgrade: the
shard jobs it committed hold their entries in the format's version-1 dialect, and the
finalize reads them as they are and writes the one schema (version 2), meaning what a run
of today's code alone writes."""

from __future__ import annotations

import glob
import json

import pytest
from packhelp import manifest_meaning, noise_tree, set_digests

from stoker.formats.manifest import load
from stoker.formats.registry import get
from stoker.pack.steps import finalize_pack, pack_shards, plan_pack


def _to_v1(fmt: str, entry: dict) -> dict:
    """A version-2 shard entry in ``fmt``'s version-1 dialect (what an earlier release's
    shard job wrote in its side-car), by the format's own table."""
    out = {k: v for k, v in entry.items() if k not in ("files", "bytes", "checksums")}
    for field, (kind, where) in get(fmt).v1.entry.items():
        base = kind.rstrip("?")
        value = (
            entry["files"].get(where)
            if base == "file"
            else entry.get(where)
            if base == "count"
            else entry["checksums"].get(where)
        )
        if value is not None:
            out[field] = value
    return out


@pytest.mark.parametrize("fmt", ["recordio", "tfrecord", "wds"])
def test_a_finalize_reads_side_cars_an_earlier_release_wrote(tmp_path, fmt):
    src = str(tmp_path / "src")
    noise_tree(src, 9)
    runs = {}
    for name in ("today", "upgraded"):
        out = str(tmp_path / name / "set")
        plan = plan_pack(src, out, format=fmt, shard_size=4)
        pack_shards(plan, ":", workers=1, progress=False)
        if name == "upgraded":
            for side in sorted(glob.glob(out + "-*.pack-shard.json")):
                with open(side) as f:
                    doc = json.load(f)
                doc["entry"] = _to_v1(fmt, doc["entry"])
                assert "files" not in doc["entry"]
                with open(side, "w") as f:
                    json.dump(doc, f)
        finalize_pack(plan, progress=False)
        runs[name] = out
    new = load(runs["upgraded"] + ".stoker.json")
    assert (new["format"], new["version"], new["kind"]) == ("stoker", 2, fmt)
    assert manifest_meaning(runs["upgraded"] + ".stoker.json") == manifest_meaning(
        runs["today"] + ".stoker.json"
    )
    a, b = set_digests(runs["today"]), set_digests(runs["upgraded"])
    assert a == b  # the manifests too, byte for byte: the same version-2 text
