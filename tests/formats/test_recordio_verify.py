"""verify_records walks the whole file and reports every problem with key, offset and reason."""

from __future__ import annotations

import os

import numpy as np
import pytest
import simplejpeg
from _recordio_util import payload, write_rec

from stoker.formats.recordio import (
    IRHeader,
    RecordWriter,
    make_manifest,
    pack_header,
    shard_entry,
    verify_records,
    write_manifest,
)


def _jpeg(seed):
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
    return simplejpeg.encode_jpeg(img, quality=80)


def _decode(buf):
    simplejpeg.decode_jpeg(buf)


def _patch(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_clean_file(tmp_path):
    rec = write_rec(tmp_path, [payload(i) for i in range(25)])
    rep = verify_records(rec)
    assert rep.ok and rep.records == 25 and rep.indexed == 25 and rep.checksummed == 25
    assert rep.data_bytes == os.path.getsize(rec)
    assert "OK" in rep.summary()


def test_decode_failures_name_the_key(tmp_path):
    rec = tmp_path / "j.rec"
    with RecordWriter(rec, checksums=True) as w:
        for k in range(6):
            jpg = _jpeg(k)
            if k == 4:
                jpg = jpg[: len(jpg) // 3]  # a truncated JPEG, stored faithfully
            w.write(k, pack_header(IRHeader(0, float(k), k, 0), jpg))
    rep = verify_records(rec, decode=_decode)
    assert rep.decoded == 5 and [p.key for p in rep.problems] == [4]
    assert "image does not decode" in rep.problems[0].reason
    assert verify_records(rec).ok  # without decode= the container is fine


def test_framing_problem_then_resync(tmp_path):
    ps = [payload(i, size=40) for i in range(10)]
    rec = write_rec(tmp_path, ps)
    with open(rec[:-4] + ".idx") as f:
        offs = [int(line.split("\t")[1]) for line in f]
    _patch(rec, offs[3], b"\x00\x00\x00\x00")
    rep = verify_records(rec)
    assert rep.records == 9  # every record but the damaged one was still walked
    first = rep.problems[0]
    assert (first.key, first.offset, first.idx_line) == (3, offs[3], 4)
    assert "bad magic 0x00000000" in first.reason
    assert any(p.key == 3 and "not the start of a record" in p.reason for p in rep.problems)
    assert "key 3" in str(first) and f"byte offset {offs[3]}" in str(first)


def test_records_missing_from_idx_and_idx_errors(tmp_path):
    rec = write_rec(tmp_path, [payload(i) for i in range(5)])
    idx = rec[:-4] + ".idx"
    with open(idx) as f:
        lines = f.readlines()
    with open(idx, "w") as f:
        f.writelines(lines[:2] + lines[3:])
    rep = verify_records(rec, checksums=False)
    unlisted = [p for p in rep.problems if "not listed" in p.reason]
    assert len(unlisted) == 1 and unlisted[0].offset == int(lines[2].split("\t")[1])
    with open(idx, "w") as f:
        f.write("0\t0\nnonsense\n")
    rep = verify_records(rec, checksums=False)
    assert rep.problems[0].idx_line == 2 and rep.records == 5


def test_missing_idx_and_crc_are_notes_not_problems(tmp_path):
    rec = write_rec(tmp_path, [payload(i) for i in range(3)], checksums=False)
    os.unlink(rec[:-4] + ".idx")
    rep = verify_records(rec)
    assert rep.ok and rep.records == 3
    assert any("no .idx" in n for n in rep.notes) and any("no checksum" in n for n in rep.notes)


def test_manifest_walks_every_shard(tmp_path):
    infos = []
    for j in range(3):
        w = RecordWriter(tmp_path / f"s{j}.rec", checksums=True)
        for i in range(4):
            w.write(i, payload(10 * j + i))
        infos.append(w.commit())
    mp = tmp_path / "s.stoker.json"
    write_manifest(mp, make_manifest([shard_entry(i, mp) for i in infos]))
    rep = verify_records(mp)
    assert rep.ok and rep.records == 12 and rep.checksummed == 12
    _patch(tmp_path / "s1.rec", 40, b"\x01")
    os.unlink(tmp_path / "s2.rec")
    rep = verify_records(mp)
    assert {os.path.basename(p.path) for p in rep.problems} == {"s1.rec", "s2.rec"}
    assert any("checksum mismatch" in p.reason for p in rep.problems)
    assert any("missing" in p.reason for p in rep.problems)


def test_problem_list_is_capped_but_counted(tmp_path):
    rec = write_rec(tmp_path, [payload(i, size=8) for i in range(30)])
    with open(rec[:-4] + ".idx", "w") as f:
        f.write("".join(f"{i}\t{4 + 48 * i}\n" for i in range(30)))
    rep = verify_records(rec, max_problems=5, checksums=False)
    assert len(rep.problems) == 5 and rep.problem_count >= 30 and not rep.ok
    with pytest.raises(ValueError):
        verify_records(rec, max_problems=-1)
