"""`stoker inspect` over the reader objects it can meet: a manifest of several shards, and a
bare insightface ``.rec`` (no manifest)."""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image

from stoker.cli import main
from stoker.cli.inspect_cmd import inspect_records
from stoker.formats.recordio import (
    IRHeader,
    RecordWriter,
    make_manifest,
    pack_header,
    shard_entry,
    write_manifest,
)


def test_inspect_counts_every_shard_of_a_manifest(tmp_path, capsys):
    mpath = tmp_path / "s.stoker.json"
    entries = []
    for j, n in enumerate((3, 2)):
        w = RecordWriter(tmp_path / f"s-{j}.rec")
        for k in range(n):
            w.write(k, pack_header(IRHeader(0, float(k % 2), k, 0), b"not an image"))
        entries.append(shard_entry(w.commit(), mpath))
    write_manifest(mpath, make_manifest(entries, classes={"a": 0, "b": 1}, rejects={"count": 4}))
    info = inspect_records(mpath)
    assert info["records"] == 5 and info["shards"] == 2
    assert info["rec_bytes"] == sum(e["bytes"] for e in entries)
    assert info["classes"] == 2 and info["per_class"] == {"a": 3, "b": 2}
    assert info["rejects"] == 4 and "identities" not in info
    assert info["images"]["unreadable_headers"] == 5  # "not an image"
    assert main(["inspect", str(mpath)]) == 1  # corrupt records are not a success
    out = capsys.readouterr().out
    assert "records:       5 in 2 shard(s)" in out and "unreadable:  5" in out
    assert main(["inspect", str(mpath), "--json"]) == 1


def _jpeg(seed: int) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, size=(6, 5, 3), dtype=np.uint8)
    b = io.BytesIO()
    Image.fromarray(arr).save(b, "JPEG")
    return b.getvalue()


def test_inspect_names_the_identities_of_an_insightface_rec(tmp_path, capsys):
    rec = tmp_path / "faces.rec"
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(0, [4, 6], 0, 0), b""))  # images 1..3, identities 4..5
        for k, ident in ((1, 0), (2, 0), (3, 1)):
            w.write(k, pack_header(IRHeader(0, float(ident), k, 0), _jpeg(k)))
        w.write(4, pack_header(IRHeader(0, [1, 3], 0, 0), b""))
        w.write(5, pack_header(IRHeader(0, [3, 4], 0, 0), b""))
    info = inspect_records(rec)
    assert info["records"] == 6 and info["shards"] == 1 and info["identities"] == 2
    assert info["classes"] is None and "rejects" not in info
    # the header and identity records are metadata, not unreadable images
    assert info["metadata_records"] == 3 and info["images"]["unreadable_headers"] == 0
    assert info["images"]["sampled"] == 3 and info["images"]["height"]["max"] == 6
    assert info["labels"]["kind"] == "scalar" and info["labels"]["distinct"] == 2
    assert info["metadata"] == {"header": 1, "identity": 2}
    assert main(["inspect", str(rec)]) == 0
    out = capsys.readouterr().out
    assert "identities:    2 (insightface layout)" in out
    assert (
        "metadata records: 3 (insightface: 1 header record, 2 identity records; not images)" in out
    )
    # no Python argument offered as advice on the command line
    assert "unreadable" not in out and "positions=" not in out and "pass " not in out
    assert main(["inspect", str(rec), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["records"] == 6 and shown["metadata_records"] == 3
    assert shown["metadata"] == {"header": 1, "identity": 2} and shown["identities"] == 2
    assert shown["images"]["unreadable_headers"] == 0 and shown["images"]["sampled"] == 3


def test_inspect_counts_records_outside_the_insightface_ranges(tmp_path, capsys):
    rec = tmp_path / "faces.rec"
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(0, [3, 4], 0, 0), b""))  # images 1..2, identity 3
        for k in (1, 2):
            w.write(k, pack_header(IRHeader(0, 0.0, k, 0), _jpeg(k)))
        w.write(3, pack_header(IRHeader(0, [1, 3], 0, 0), b""))
        w.write(4, pack_header(IRHeader(0, [0, 0], 0, 0), b""))  # beyond b: no image, no identity
    assert main(["inspect", str(rec), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["metadata_records"] == 3
    assert shown["metadata"] == {"header": 1, "identity": 1, "other": 1}
    assert main(["inspect", str(rec)]) == 0
    assert "1 header record, 1 identity record, 1 other record" in capsys.readouterr().out
