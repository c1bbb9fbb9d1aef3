"""Stoker-written WebDataset tars carry a per-sample CRC32C side-car (``NAME.crc32c``, named by
the manifest entry), checked on every read: a flipped byte in a sample's image or label is a
``CorruptRecordError`` naming the tar, the sample and its byte offset (raised or skipped, as
``on_error`` says), and ``stoker verify`` lists it. A tar without a side-car (a foreign one)
is read unchecked, and ``verify`` says so."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from stoker._core.errors import CorruptRecordError, StokerError
from stoker.cli import main as cli
from stoker.formats.wds import open_reader
from stoker.loader import Loader
from stoker.pack import make_sample_data, pack


@pytest.fixture
def wds_set(tmp_path) -> str:
    make_sample_data(tmp_path / "imgs", classes=2, per_class=6, size=32, seed=3)
    pack(tmp_path / "imgs", tmp_path / "set", format="wds", shard_size=6, workers=1, progress=False)
    return str(tmp_path / "set.stoker.json")


def _flip_image_byte(manifest: str, position: int) -> tuple[str, int]:
    """Flip one byte in the middle of sample ``position``'s image data; its tar and the byte
    offset of the sample's first header."""
    r = open_reader(manifest)
    image = bytes(r.reader()(position)[0])
    s, j = r.where(position)
    tar, header = r.shard(s).path, int(r.shard(s).index().headers[j])
    r.close()
    with open(tar, "rb") as f:
        data = f.read()
    at = data.index(image, header) + len(image) // 2
    with open(tar, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x10]))
    return tar, header


def test_every_tar_has_its_side_car_named_by_the_manifest(wds_set):
    with open(wds_set) as f:
        shards = json.load(f)["shards"]
    folder = os.path.dirname(wds_set)
    for s in shards:
        crc = s["files"]["crc"]
        assert crc == s["files"]["data"][: -len(".tar")] + ".crc32c"
        assert os.path.getsize(os.path.join(folder, crc)) == 4 * s["records"]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_flipped_image_byte_is_caught_on_read(wds_set, workers):
    tar, offset = _flip_image_byte(wds_set, 8)
    kw = dict(batch_size=4, workers=workers, shuffle=False)
    with Loader(wds_set, on_error="skip", max_bad_fraction=0.5, **kw) as ld:
        keys = [int(k) for b in ld for k in b.keys]
        assert [r["key"] for r in ld.rejects] == [8]
        assert "checksum mismatch" in ld.rejects[0]["reason"]
    assert keys == [k for k in range(12) if k != 8]
    with Loader(wds_set, **kw) as ld:
        with pytest.raises(CorruptRecordError, match="checksum mismatch") as e:
            list(ld)
    assert e.value.path == tar and e.value.offset == offset


def test_verify_lists_the_damaged_sample(wds_set, capsys):
    _flip_image_byte(wds_set, 3)
    assert cli(["verify", wds_set]) == 1
    out = capsys.readouterr().out
    assert "checksum mismatch" in out and "set-00000.tar" in out


def test_a_side_car_of_the_wrong_size_is_refused_at_open(wds_set):
    side = os.path.join(os.path.dirname(wds_set), "set-00001.crc32c")
    with open(side, "ab") as f:
        f.write(struct.pack("<I", 7))
    with pytest.raises(StokerError, match="set-00001.crc32c"):
        with Loader(wds_set, batch_size=4, shuffle=False) as ld:
            list(ld)


def test_a_tar_without_a_side_car_is_read_unchecked_and_verify_says_so(wds_set, capsys):
    folder = os.path.dirname(wds_set)
    tar = os.path.join(folder, "set-00000.tar")  # read bare: no manifest names a side-car
    os.rename(wds_set, wds_set + ".away")
    os.remove(os.path.join(folder, "set-00000.crc32c"))
    with Loader(tar, batch_size=6, shuffle=False) as ld:
        (batch,) = list(ld)
    assert np.asarray(batch.images).shape[0] == 6
    assert cli(["verify", tar]) == 0
    assert "no per-sample checksums" in capsys.readouterr().out
