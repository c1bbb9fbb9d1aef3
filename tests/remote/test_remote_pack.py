"""``stoker pack SRC s3://...``: staged locally, uploaded shards first and the manifest last;
the uploaded set reads as the local pack does; a rerun keeps what is already there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import stoker
from stoker.storage.remote import Remote
from storage_doubles import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("pack-src")
    stoker.make_sample_data(root / "img", classes=2, per_class=9, size=40, seed=1, workers=1)
    return str(root / "img")


def _objects(bucket: str) -> dict[str, bytes]:
    r = Remote(f"s3://{bucket}")
    fs = r.fs()
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in fs.find(f"{bucket}/sets")}


def test_pack_to_s3_equals_a_local_pack(images, s3env, tmp_path):
    local = stoker.pack(images, tmp_path / "loc" / "train", shard_size=5, workers=1)
    url = f"s3://{s3env}/sets/train"
    report = stoker.pack(images, url, shard_size=5, workers=1)
    assert report.manifest == url + ".stoker.json"
    got = _objects(s3env)
    want = {n: (tmp_path / "loc" / n).read_bytes() for n in os.listdir(tmp_path / "loc")}
    assert got == want
    assert local.written == report.written == 18
    # the staging folder is gone once the manifest is up
    from stoker.pack.commit.remote import staging_prefix

    assert not os.path.exists(os.path.dirname(staging_prefix(url)))
    # and an existing manifest is refused without overwrite
    with pytest.raises(stoker.OutputExistsError):
        stoker.pack(images, url, shard_size=5, workers=1)


def test_a_rerun_keeps_good_objects_and_replaces_bad_ones(images, s3env, monkeypatch):
    url = f"s3://{s3env}/sets/train"
    r = Remote(url)
    stoker.pack(images, url, shard_size=5, workers=1)
    good = _objects(s3env)
    # an interrupted upload: the manifest never went up, one shard is damaged
    r.remove(url + ".stoker.json")
    damaged = f"s3://{s3env}/sets/train-00001.rec"
    data = bytearray(good["train-00001.rec"])
    data[50] ^= 0xFF
    r.fs().pipe_file(r._path(damaged), bytes(data))
    uploads: list[str] = []
    real = Remote.upload

    def counting(self, local, target):
        uploads.append(target.rsplit("/", 1)[-1])
        return real(self, local, target)

    monkeypatch.setattr(Remote, "upload", counting)
    stoker.pack(images, url, shard_size=5, workers=1)
    assert _objects(s3env) == good
    # of the shards' objects only the damaged one goes up again (each shard's small side-car,
    # its commit point, and the set's files do too)
    data = sorted(u for u in uploads if not u.endswith(".pack-shard.json"))
    assert data == ["train-00001.rec", "train.rejects.tsv", "train.stoker.json"]


def test_the_cli_packs_to_s3_without_showing_credentials(images, s3env, s3_server):
    env = dict(os.environ, **s3_server.env())
    url = f"s3://{s3env}/sets/cli"
    p = subprocess.run(
        [sys.executable, "-m", "stoker.cli", "pack", images, url, "--shard-size", "6"],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout + p.stderr
    assert FAKE_SECRET_ACCESS_KEY not in out and FAKE_ACCESS_KEY_ID not in out
    assert url in out
    with stoker.Loader(url + ".stoker.json", batch_size=6, workers=0) as ld:
        assert sum(len(b.keys) for b in ld) == 18


def test_the_cli_takes_credentials_from_storage_options(images, s3env, s3_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "none")
    env["AWS_CONFIG_FILE"] = str(tmp_path / "none")
    url = f"s3://{s3env}/sets/opts"
    cmd = [sys.executable, "-m", "stoker.cli", "pack", images, url, "--quiet"]
    for kv in (
        f"endpoint_url={s3_server.endpoint}",
        f"key={FAKE_ACCESS_KEY_ID}",
        f"secret={FAKE_SECRET_ACCESS_KEY}",
    ):
        cmd += ["--storage-option", kv]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=100)
    assert p.returncode == 0, p.stderr
    assert FAKE_SECRET_ACCESS_KEY not in p.stdout + p.stderr
    assert Remote(url + ".stoker.json").exists(url + ".stoker.json")
