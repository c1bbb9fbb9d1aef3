"""`stoker verify` of a set with 0 records (an empty TFRecord, a tar with no samples, a
``.rec`` with nothing in it) says so and exits 1: more likely a broken export than an intended
set. ``--allow-empty`` accepts it."""

from __future__ import annotations

import tarfile

import pytest
from _cli_util import verify_json


def _empty(tmp_path, kind: str) -> str:
    if kind == "tar":
        path = str(tmp_path / "e.tar")
        tarfile.open(path, "w").close()  # just the end-of-archive blocks
    else:
        path = str(tmp_path / f"e.{kind}")
        open(path, "wb").close()
    return path


@pytest.mark.parametrize("kind", ["tfrecord", "tar", "rec"])
def test_a_set_of_zero_records_fails_unless_allowed(tmp_path, kind):
    path = _empty(tmp_path, kind)
    rc, rep = verify_json(path)
    assert rc == 1 and rep["records"] == 0
    assert [p["text"] for p in rep["problems"]] == [
        f"{path}: 0 records: an empty set (--allow-empty accepts it)"
    ]
    if kind == "tfrecord":  # the option is the CLI's, the same for every format
        rc, rep = verify_json(path, "--allow-empty")
        assert rc == 0 and rep["ok"]
