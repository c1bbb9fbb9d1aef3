"""Sets written before every format shared one manifest schema still open: the version-1
manifest of each dialect (``tests/formats/golden``, packed by that version, never rewritten)
reads the same samples as it did then, passes ``verify``, and means what a version-2 manifest
of the same shards means."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

import stoker.formats as formats
from stoker._core.errors import ManifestError
from stoker.formats.manifest import load, make, write_json
from stoker.formats.registry import get

GOLDEN = Path(__file__).parent / "golden"
FORMATS = ["recordio", "tfrecord", "wds"]
EXPECTED = json.loads((GOLDEN / "samples.json").read_text())


@pytest.fixture(params=FORMATS)
def golden(request, tmp_path):
    """A copy of one format's golden set (the originals stay untouched)."""
    shutil.copytree(GOLDEN / request.param, tmp_path / request.param)
    return request.param, tmp_path / request.param / "g.stoker.json"


def _samples(path) -> dict:
    with formats.open(str(path)) as r:
        read = r.reader()
        rows = []
        for i in range(len(r)):
            image, label, key, _ = read(i)
            rows.append([int(key), int(label), hashlib.sha256(bytes(image)).hexdigest()])
        return {"samples": rows, "classes": r.class_names, "shard_sizes": r.shard_sizes().tolist()}


def test_a_version_1_manifest_reads_the_same_samples_and_verifies(golden):
    fmt, path = golden
    assert json.loads(path.read_text())["format"] == get(fmt).v1.format  # still version 1
    assert _samples(path) == EXPECTED[fmt]
    report = get(fmt).load("verify")(str(path))
    assert report.ok, report.problems


def test_a_version_1_manifest_means_what_its_version_2_form_means(golden):
    """Loaded, a version-1 manifest is the version-2 manifest of the same shards: written out
    as version 2, it loads to the same entries and reads the same samples."""
    fmt, path = golden
    old = load(path)
    assert old["format"] == "stoker" and old["version"] == 2 and old["kind"] == fmt
    assert [e.records for e in old["shards"]] == [3, 3]
    assert all(e.bytes == (path.parent / e.files["data"]).stat().st_size for e in old["shards"])
    v2 = path.with_name("v2.stoker.json")
    write_json(
        v2,
        make(
            fmt,
            [e.to_json() for e in old["shards"]],
            classes=old["classes"],
            schema=old.get("schema"),
            options=old.get("options"),
            pack=old["pack"],
            rejects=old["rejects"],
        ),
    )
    new = load(v2)
    assert new == {**old}
    assert _samples(v2) == EXPECTED[fmt]


@pytest.mark.parametrize(
    ("fmt", "field", "value", "named"),
    [
        ("recordio", "rec_bytes", -1, "shards[1].rec_bytes"),
        ("recordio", "idx_sha256", "ABC", "shards[1].idx_sha256"),
        ("tfrecord", "path", "../g.tfrecord", "shards[1].path"),
        ("wds", "tar_bytes", True, "shards[1].tar_bytes"),
    ],
)
def test_a_bad_version_1_field_is_named_as_it_was(tmp_path, fmt, field, value, named):
    m = json.loads((GOLDEN / fmt / "g.stoker.json").read_text())
    m["shards"][1][field] = value
    bad = tmp_path / "bad.stoker.json"
    bad.write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=named.replace("[", r"\[").replace("]", r"\]")):
        load(bad)
