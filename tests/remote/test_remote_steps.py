"""The pack steps with an ``s3://`` OUT (moto's S3 server on loopback): shard jobs on
"machines" that share no folder (each its own cache directory) stage, upload, and leave a
side-car at the URL; finalize checks the objects without downloading them and uploads the
manifest last. The objects are a one-machine local pack's files byte for byte; a missing or
damaged object is named; convert runs the same steps; the Ray engine uploads per task."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import stoker
from stoker._core.errors import PackError
from stoker.cli import main
from stoker.pack.steps import finalize_pack, pack_shards, plan_pack
from stoker.storage.remote import Remote
from storage_doubles import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY

pytestmark = pytest.mark.timeout(120)

OPTS = {"shard_size": 4, "shuffle": True, "seed": 2, "list_file": True}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("steps-src")
    stoker.make_sample_data(root / "img", classes=2, per_class=7, size=40, seed=1, workers=1)
    with open(root / "img" / "class_00" / "zero.jpg", "wb"):
        pass  # an empty file: a reject in some shard
    return str(root / "img")


def _objects(bucket: str) -> dict[str, bytes]:
    fs = Remote(f"s3://{bucket}").fs()
    fs.invalidate_cache()
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in fs.find(f"{bucket}/sets")}


def _files(folder) -> dict[str, bytes]:
    out = {}
    for n in os.listdir(folder):
        with open(os.path.join(folder, n), "rb") as f:
            out[n] = f.read()
    return out


def _machine(monkeypatch, tmp_path, name: str) -> None:
    """Run what follows as another machine would: its own cache (and staging) folder."""
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / f"cache-{name}"))


@pytest.fixture
def downloads(monkeypatch) -> list[str]:
    """The base name of every object downloaded from now on."""
    seen: list[str] = []
    real = Remote.download

    def counting(self, url, out, **kw):
        seen.append(url.rsplit("/", 1)[-1])
        return real(self, url, out, **kw)

    monkeypatch.setattr(Remote, "download", counting)
    return seen


def test_shard_jobs_to_s3_give_the_local_pack_bytes(
    images, s3env, tmp_path, monkeypatch, downloads
):
    local = tmp_path / "loc"
    stoker.pack(images, local / "train", workers=1, progress=False, **OPTS)
    url = f"s3://{s3env}/sets/train"
    plan = plan_pack(images, url, plan=tmp_path / "train.plan.json", **OPTS)
    for machine, part in (("a", "2:"), ("b", ":2")):  # no folder shared between them
        _machine(monkeypatch, tmp_path, machine)
        assert pack_shards(plan, part, workers=1, progress=False).packed
    sidecars = sorted(n for n in _objects(s3env) if n.endswith(".pack-shard.json"))
    assert len(sidecars) == 4 and not any(n.endswith(".stoker.json") for n in _objects(s3env))
    # a rerun anywhere finds every shard done at the URL
    _machine(monkeypatch, tmp_path, "c")
    again = pack_shards(plan, None, workers=1, progress=False)
    assert again.skipped == (0, 1, 2, 3) and again.packed == ()
    downloads.clear()
    report = finalize_pack(plan, progress=False)
    assert report.manifest == url + ".stoker.json"
    assert (report.written, report.rejected) == (14, 1)
    assert _objects(s3env) == _files(local)  # side-cars gone, every file byte for byte
    # the objects were checked by their ETags: only the side-cars came down
    assert downloads and all(n.endswith(".pack-shard.json") for n in downloads), downloads
    for machine in "abc":  # each machine's staged copies are gone
        staging = tmp_path / f"cache-{machine}" / "staging"
        assert not [f for _, _, fs in os.walk(staging) for f in fs if not f.endswith(".lock")]


def test_finalize_names_a_missing_or_damaged_object_and_a_rerun_repairs_it(
    images, s3env, tmp_path, monkeypatch, downloads
):
    local = tmp_path / "loc"
    stoker.pack(images, local / "train", workers=1, progress=False, **OPTS)
    url = f"s3://{s3env}/sets/train"
    r = Remote(url)
    plan = plan_pack(images, url, plan=tmp_path / "p.json", **OPTS)
    pack_shards(plan, None, workers=1, progress=False)
    r.remove(f"s3://{s3env}/sets/train-00001.idx")
    rec = f"s3://{s3env}/sets/train-00002.rec"
    data = bytearray(r.fs().cat_file(rec))
    data[len(data) // 2] ^= 0xFF  # same size: only a checksum tells
    r.fs().pipe_file(rec, bytes(data))
    downloads.clear()
    with pytest.raises(PackError) as e:
        finalize_pack(plan, progress=False)
    msg = str(e.value)
    assert "2 of 4 shard(s) not ready" in msg
    assert f"shard 1: s3://{s3env}/sets/train-00001.idx is missing" in msg
    assert f"shard 2: {rec} does not hold the bytes the shard job wrote" in msg
    assert "train-00002.rec" in downloads  # its ETag differs: downloaded to check its CRC32C
    assert not r.exists(url + ".stoker.json")
    redo = pack_shards(plan, None, workers=1, progress=False)
    assert redo.packed == (1, 2) and redo.skipped == (0, 3)
    finalize_pack(plan, progress=False)
    assert _objects(s3env) == _files(local)


def test_convert_steps_to_s3_from_s3_give_the_one_machine_convert(
    remote_set, s3env, tmp_path, monkeypatch
):
    """A convert whose source and output are both URLs, through the CLI's steps; the plan
    keeps no credential."""
    args = ["--format", "wds", "--shard-size", "25", "--cache-dir", str(tmp_path / "sc")]
    secret = ["--storage-option", f"key={FAKE_ACCESS_KEY_ID}"]
    secret += ["--storage-option", f"secret={FAKE_SECRET_ACCESS_KEY}"]
    ref = tmp_path / "ref"
    assert main(["convert", remote_set.local, str(ref / "c"), *args[:4], "--quiet"]) == 0
    url = remote_set.key_url("c")
    plan = str(tmp_path / "c.plan.json")
    assert (
        main(["convert", remote_set.url, url, *args, *secret, "--plan-only", "--plan", plan]) == 0
    )
    with open(plan, encoding="utf-8") as f:
        text = f.read()
    assert FAKE_SECRET_ACCESS_KEY not in text and '"convert": true' in text
    for machine, part in (("a", "1:"), ("b", "0")):
        _machine(monkeypatch, tmp_path, machine)
        step = ["convert", "--plan", plan, "--shards", part, "--workers", "1", "--quiet"]
        assert main([*step, *secret]) == 0
    assert main(["convert", "--plan", plan, "--finalize", "--quiet", *secret]) == 0
    got = {n: b for n, b in _objects(s3env).items() if n.startswith("c")}
    assert got == _files(ref)


def test_cli_pack_steps_to_s3_keep_the_plan_here_and_print_urls(
    images, s3env, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    _machine(monkeypatch, tmp_path, "cli")
    url = f"s3://{s3env}/sets/cli"
    assert main(["pack", images, url, "--shard-size", "6", "--plan-only", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"] == "cli.plan.json"  # here, local
    assert main(["pack", "--plan", "cli.plan.json", "--shards", "0:3", "--quiet"]) == 0
    assert main(["pack", "--plan", "cli.plan.json", "--finalize"]) == 0
    out = capsys.readouterr()
    assert url in out.out and str(tmp_path / "cache-cli") not in out.out + out.err
    with stoker.Loader(url + ".stoker.json", batch_size=5, workers=0) as ld:
        assert sum(len(b.keys) for b in ld) == 14


RAY_DRIVER = """
import json, sys
import ray
import stoker
ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
src, url = sys.argv[1:3]
opts = dict(shard_size=4, shuffle=True, seed=2, list_file=True, progress=False)
report = stoker.pack(src, url, engine="ray", **opts)
conv = stoker.convert(url + ".stoker.json", url + "-wds", format="wds", shard_size=5,
                      engine="ray", progress=False)
assert ray.is_initialized(), "a Ray the caller started is left running"
ray.shutdown()
print(json.dumps([report.to_json(), conv.to_json()]))
"""


@pytest.mark.interop
@pytest.mark.timeout(300)
def test_ray_engine_to_s3_gives_the_local_bytes(images, s3env, s3_server, tmp_path):
    """A pack, then a convert of the packed set (URL to URL), each one Ray task per shard, on a
    Ray the caller started (and left running by stoker)."""
    local = tmp_path / "loc"
    stoker.pack(images, local / "train", workers=1, progress=False, **OPTS)
    manifest = str(local / "train.stoker.json")
    stoker.convert(manifest, local / "train-wds", format="wds", shard_size=5, workers=1)
    url = f"s3://{s3env}/sets/train"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(s3_server.env(), RAY_AUTH_MODE="disabled", STOKER_CACHE_DIR=str(tmp_path / "c"))
    got = subprocess.run(
        [sys.executable, "-c", RAY_DRIVER, images, url],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert got.returncode == 0, got.stderr[-3000:]
    report, conv = json.loads(got.stdout.strip().splitlines()[-1])
    assert report["manifest"] == url + ".stoker.json" and report["written"] == 14
    assert conv["manifest"] == url + "-wds.stoker.json" and conv["written"] == 14
    assert _objects(s3env) == _files(local)
