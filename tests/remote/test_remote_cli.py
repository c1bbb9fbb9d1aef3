"""`stoker inspect`, `verify`, `unpack` and `convert` on a set's manifest URL (moto's S3 server on
loopback, the CLI in a subprocess with the server's AWS_* environment): the same answers as on
the local copy, problems named by the shard's URL, a set larger than --cache-limit, and no
credential in any output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stoker.formats.recordio import RecordFile
from stoker.storage.remote import Remote
from storage_doubles import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY, upload_tree

pytestmark = pytest.mark.timeout(120)

SECRETS = (FAKE_SECRET_ACCESS_KEY, FAKE_ACCESS_KEY_ID)


def stoker(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in a child process with this process's environment (the server's AWS_*
    variables, set by the fixtures); no secret in its stdout or stderr."""
    p = subprocess.run(
        [sys.executable, "-m", "stoker.cli", *args],
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=90,
    )
    for secret in SECRETS:
        assert secret not in p.stdout and secret not in p.stderr, (args, p.stdout, p.stderr)
    return p


@pytest.fixture(autouse=True)
def _own_stoker_cache(tmp_path, monkeypatch):
    """The children's default cache (manifests, index caches) inside the test's folder."""
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "stoker-cache"))


def _json(p: subprocess.CompletedProcess) -> dict:
    assert p.stdout, p.stderr
    return json.loads(p.stdout)


def test_inspect_of_a_url_equals_inspect_of_the_local_copy(remote_set, cache_dir):
    local = _json(stoker("inspect", remote_set.local, "--json"))
    p = stoker("inspect", remote_set.url, "--json", "--cache-dir", cache_dir)
    assert p.returncode == 0, p.stderr
    got = _json(p)
    assert got["file"] == remote_set.url and got["format"] == "recordio"
    for field in ("records", "shards", "bytes", "rec_bytes", "bytes_per_record", "classes"):
        assert got[field] == local[field], field
    for field in ("labels", "per_class", "images"):
        assert got[field] == local[field], field
    assert os.listdir(os.path.join(cache_dir, "entries"))  # read through the given cache


def _flip_a_payload_byte(rec_path: str, record: int) -> tuple[int, int]:
    """Flip one byte inside record ``record``'s image bytes; ``(key, offset)`` of the record."""
    with RecordFile(rec_path) as r:
        key, off = int(r.key(record)), int(r.offset(record))
    data = bytearray(Path(rec_path).read_bytes())
    data[off + 8 + 24 + 40] ^= 0x10
    Path(rec_path).write_bytes(bytes(data))
    return key, off


@pytest.mark.parametrize("limit", [None, pytest.param("20K", marks=pytest.mark.slow)])
def test_verify_a_url_passes_and_names_the_url_of_a_corrupt_shard(
    remote_set, cache_dir, tmp_path, limit
):
    """A good set verifies; a shard object with one flipped byte is named by its URL, with
    the record's key, byte offset and .idx line, as a local verify of the same bytes names it.
    With a 20 KiB budget the 93 KB set verifies shard by shard."""
    opts = ["--cache-dir", cache_dir] + (["--cache-limit", limit] if limit else [])
    good = stoker("verify", remote_set.url, *opts)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.strip().endswith("OK")

    corrupt = tmp_path / "corrupt"
    shutil.copytree(os.path.dirname(remote_set.local), corrupt)
    key, off = _flip_a_payload_byte(str(corrupt / "train-00003.rec"), 2)
    Remote(f"s3://{remote_set.bucket}").upload(
        str(corrupt / "train-00003.rec"), remote_set.key_url("train-00003.rec")
    )
    p = stoker("verify", remote_set.url, "--json", *opts)
    assert p.returncode == 1, p.stderr
    report = _json(p)
    url = remote_set.key_url("train-00003.rec")
    assert {q["path"] for q in report["problems"]} == {url}
    whole = [q for q in report["problems"] if q["key"] is None]
    assert len(whole) == 1 and "data.crc32c" in whole[0]["reason"]
    local = _json(stoker("verify", str(corrupt / "train.stoker.json"), "--json"))
    assert local["problem_count"] == 2  # the record, and the whole .rec's data.crc32c, as here
    want = [(q["key"], q["offset"], q["idx_line"], q["reason"]) for q in local["problems"]]
    got = [(q["key"], q["offset"], q["idx_line"], q["reason"]) for q in report["problems"]]
    assert got == want
    assert want[0][:2] == (key, off) and want[0][2] == 3  # the record's .idx line
    assert cache_dir not in p.stdout  # a problem names the URL, never the cached copy
    text = stoker("verify", remote_set.url, *opts)
    assert f"problem: {url}, key {key}, byte offset {off}, .idx line 3: checksum mismatch" in (
        text.stdout
    )
    assert not [n for n in os.listdir(cache_dir) if n.startswith("verify-")]  # removed


def _tree(root) -> dict[str, bytes]:
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            out[os.path.relpath(p, root)] = Path(p).read_bytes()
    return out


def test_unpack_from_a_url_equals_unpack_from_local(remote_set, cache_dir, tmp_path):
    assert stoker("unpack", remote_set.local, str(tmp_path / "a"), "--quiet").returncode == 0
    p = stoker("unpack", remote_set.url, str(tmp_path / "b"), "--json", "--cache-dir", cache_dir)
    assert p.returncode == 0, p.stderr
    assert _json(p)["file"] == remote_set.url and _json(p)["images"] == 60
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert len(a) == 60 and a == b


def test_convert_from_a_url_equals_convert_from_local(remote_set, cache_dir, tmp_path):
    common = ["--format", "tfrecord", "--workers", "2", "--quiet"]
    a = stoker("convert", remote_set.local, str(tmp_path / "a" / "t"), *common)
    assert a.returncode == 0, a.stderr
    b = stoker(
        "convert", remote_set.url, str(tmp_path / "b" / "t"), *common,
        "--cache-dir", cache_dir,
    )  # fmt: skip
    assert b.returncode == 0, b.stderr
    for name in ("t.tfrecord", "t.stoker.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert FAKE_SECRET_ACCESS_KEY not in (tmp_path / "b" / "t.stoker.json").read_text()


def test_a_tfrecord_url_is_inspected_and_verified_in_place(s3env, tmp_path, packed, cache_dir):
    out = tmp_path / "tf"
    assert stoker("convert", os.path.join(packed, "train.stoker.json"), str(out / "t"),
                  "--format", "tfrecord", "--workers", "1", "--quiet").returncode == 0  # fmt: skip
    upload_tree(out, f"s3://{s3env}/tf")
    url = f"s3://{s3env}/tf/t.stoker.json"
    p = stoker("inspect", url, "--json", "--cache-dir", cache_dir)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["format"] == "tfrecord" and got["records"] == 60 and got["shards"] == 1
    assert got["bytes"] == os.path.getsize(out / "t.tfrecord")
    p = stoker("verify", url, "--json", "--cache-dir", cache_dir)
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["ok"] and report["records"] == 60 and report["checksummed"] == 60


def test_storage_options_and_errors_show_no_credential(remote_set, cache_dir, tmp_path):
    """Credentials given as --storage-option (no AWS_* variables) reach the server; a wrong
    secret is one line that repeats neither secret."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "none")
    env["AWS_CONFIG_FILE"] = str(tmp_path / "none")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    creds = [
        "--storage-option", f"endpoint_url={remote_set.server.endpoint}",
        "--storage-option", f"key={FAKE_ACCESS_KEY_ID}",
        "--cache-dir", cache_dir,
    ]  # fmt: skip
    p = stoker("inspect", remote_set.url, *creds, "--storage-option",
               f"secret={FAKE_SECRET_ACCESS_KEY}", "--sample", "4", env=env)  # fmt: skip
    assert p.returncode == 0, p.stderr
    wrong = "wrongSecretValue/123+abc"
    for command in ("inspect", "verify"):
        p = stoker(
            command, remote_set.url.replace("train", "nothing"), *creds,
            "--storage-option", f"secret={wrong}", env=env,
        )  # fmt: skip
        assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert wrong not in p.stderr and "nothing.stoker.json" in p.stderr


def test_cache_limit_takes_units():
    from stoker.cli._remote import parse_size

    assert parse_size("20K") == 20 * 1024 and parse_size("2G") == 2 * 2**30
    assert parse_size("1.5MiB") == 3 * 2**19 and parse_size("3GB") == 3 * 10**9
    assert parse_size("123") == 123
    for bad in ("2X", "", "0", "-1M"):
        with pytest.raises(Exception, match="size"):
            parse_size(bad)
