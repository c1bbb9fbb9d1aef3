"""`stoker verify`: a ``.crc32c`` that the manifest names but that is missing is a failure
(integrity checking would be silently off), unless ``--allow-missing-checksums``."""

from __future__ import annotations

import os

from stoker.cli import main
from stoker.formats.recordio import (
    IRHeader,
    RecordWriter,
    make_manifest,
    pack_header,
    shard_entry,
    verify_records,
    write_manifest,
)


def _packed(tmp_path) -> str:
    mpath = str(tmp_path / "s.stoker.json")
    entries = []
    for j in range(2):
        w = RecordWriter(tmp_path / f"s-{j}.rec", checksums=True)
        for k in range(3):
            w.write(k, pack_header(IRHeader(0, float(k), k, 0), b"x" * (10 + k)))
        entries.append(shard_entry(w.commit(), mpath))
    write_manifest(mpath, make_manifest(entries))
    return mpath


def test_verify_fails_when_a_named_checksum_file_is_missing(tmp_path, capsys):
    mpath = _packed(tmp_path)
    assert main(["verify", mpath, "--quiet"]) == 0
    crc = str(tmp_path / "s-1.crc32c")
    os.remove(crc)
    capsys.readouterr()
    assert main(["verify", mpath, "--quiet"]) == 1
    out = capsys.readouterr().out
    assert f"problem: {crc}:" in out and "does not exist" in out
    assert "--allow-missing-checksums" in out
    assert main(["verify", mpath, "--quiet", "--allow-missing-checksums"]) == 0
    assert main(["verify", mpath, "--quiet", "--no-checksums"]) == 0
    rep = verify_records(mpath, progress=False)
    assert not rep.ok and rep.problems[0].path == crc and rep.checksummed == 3
    rep = verify_records(mpath, progress=False, allow_missing_checksums=True)
    assert rep.ok and any("no checksum file" in n for n in rep.notes)


def test_verify_of_a_bare_rec_without_checksums_only_notes_it(tmp_path, capsys):
    rec = tmp_path / "b.rec"
    with RecordWriter(rec) as w:
        w.write(0, pack_header(IRHeader(0, 1.0, 0, 0), b"abc"))
    assert main(["verify", str(rec)]) == 0
    assert "note: " in capsys.readouterr().out


def test_verify_names_a_truncated_checksum_file(tmp_path, capsys):
    mpath = _packed(tmp_path)
    crc = tmp_path / "s-0.crc32c"
    crc.write_bytes(crc.read_bytes()[:-4])
    assert main(["verify", mpath, "--quiet"]) == 1
    out = capsys.readouterr().out
    assert f"problem: {crc}:" in out and "3 records need 12" in out


def test_verify_names_a_shard_path_that_is_a_folder(tmp_path, capsys):
    import json

    mpath = _packed(tmp_path)
    os.mkdir(tmp_path / "sub")
    with open(mpath) as f:
        m = json.load(f)
    m["shards"][1]["files"]["data"] = "sub"
    with open(mpath, "w") as f:
        json.dump(m, f)
    assert main(["verify", mpath, "--quiet"]) == 1
    assert "shard 'sub':" in capsys.readouterr().out
