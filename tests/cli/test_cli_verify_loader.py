"""`stoker verify` opens a set exactly as the loader does, then checks more: the four sets on
which they once disagreed (issue 44, item 8). A bare tar is read through its sibling
manifest's ``.crc32c``; a WebDataset set on HTTP without a ``.crc32c`` is refused by both; a
RecordIO shard whose whole-file CRC32C differs from the manifest fails a local verify as a
download fails; a TFRecord whose records share a ``stoker/key`` is refused by both."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from set_writers import jpegs, write_set
from stoker._core.schema import Schema
from stoker.cli import main
from stoker.formats import registry
from stoker.formats.tfrecord.writer import TFRecordShardWriter
from stoker.storage.remote import close_filesystems
from storage_doubles import StaticServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="session")
def fsspec_loop() -> None:
    """fsspec's I/O thread lives as long as the process: started before any leak check."""
    import fsspec.asyn

    fsspec.asyn.get_loop()


def _set(tmp_path: Path, fmt: str) -> str:
    blobs, labels = jpegs(6, seed=5, classes=2, h0=16, w0=16, hmod=2)
    return write_set(fmt, str(tmp_path / "s"), blobs, labels, shard=3, classes=2)


def _opens(path: str, **kw: object) -> str | None:
    """``None`` when the loader's reader opens ``path`` and reads every sample, else why not."""
    try:
        with registry.open_reader(path, **kw) as r:
            read = r.reader(None)
            for i in range(len(r)):
                read(i)
    except Exception as e:  # noqa: BLE001 - the refusal is what is compared
        return str(e)
    return None


def _verify(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["verify", *args, "--quiet"])
    return rc, capsys.readouterr().out


def test_a_bare_tar_is_verified_with_its_sibling_manifests_checksums(tmp_path, capsys):
    _set(tmp_path, "wds")
    tar = tmp_path / "s-00001.tar"
    assert _verify(capsys, str(tar)) == (0, "") and _opens(str(tar)) is None
    data = bytearray(tar.read_bytes())
    at = data.find(b"\xff\xd8") + 100  # a payload byte of the first sample's image
    data[at] ^= 0x10
    tar.write_bytes(bytes(data))
    refusal = _opens(str(tar))
    assert refusal is not None and "checksum mismatch" in refusal
    rc, out = _verify(capsys, str(tar))
    assert rc == 1 and f"problem: {tar}, key 0, byte offset 0: sample '000000003'" in out
    assert "checksum mismatch" in out and "no per-sample checksums" not in out


def test_a_wds_set_on_http_without_a_crc32c_is_refused_by_both(tmp_path, capsys, fsspec_loop):
    manifest = _set(tmp_path / "set", "wds")
    (tmp_path / "set" / "s-00001.crc32c").unlink()
    with StaticServer(tmp_path / "set") as server:
        try:
            url, cache = f"{server.url}/s.stoker.json", str(tmp_path / "cache")
            refusal = _opens(url, cache_dir=cache)
            rc, out = _verify(capsys, url, "--cache-dir", cache)
        finally:
            close_filesystems()
    assert refusal is not None and "s-00001.crc32c" in refusal
    assert rc == 1 and f"problem: {server.url}/s-00001.crc32c" in out
    assert _verify(capsys, manifest)[0] == 1  # the local copy: the same answer


def test_a_wrong_whole_file_crc32c_of_a_recordio_shard_fails_a_local_verify(tmp_path, capsys):
    manifest = _set(tmp_path, "recordio")
    m = json.loads(Path(manifest).read_text())
    m["shards"][1]["checksums"]["data.crc32c"] ^= 1
    Path(manifest).write_text(json.dumps(m))
    rc, out = _verify(capsys, manifest)
    rec = os.path.join(tmp_path, "s-00001.rec")
    assert rc == 1 and f"problem: {rec}: its CRC32C is 0x" in out
    assert "the manifest's data.crc32c 0x" in out
    assert main(["verify", manifest, "--quiet", "--no-checksums"]) == 0


def test_a_tfrecord_whose_records_share_a_key_is_refused_by_both(tmp_path, capsys):
    parts = []
    for n, keys in enumerate(((4, 5), (4,))):  # TFRecord files concatenate into one
        w = TFRecordShardWriter(str(tmp_path / f"{n}.part"), schema=Schema.classification())
        for key in keys:
            w.write(key, b"\xff\xd8 not decoded here", 1, {})
        w.commit()
        parts.append((tmp_path / f"{n}.part").read_bytes())
    path = str(tmp_path / "dup.tfrecord")
    Path(path).write_bytes(b"".join(parts))
    second = len(parts[0])  # the third record, the second with key 4, starts the second part
    refusal = _opens(path)
    assert refusal is not None and "key 4 (stoker/key) is an earlier record's" in refusal
    rc, out = _verify(capsys, path)
    assert rc == 1 and path in out and f"byte offset {second}" in out
    assert "record 2: key 4 (stoker/key) is an earlier record's" in out
