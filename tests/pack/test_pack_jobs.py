"""Packing as shard jobs: a plan, shards packed in any order and split, a finalize; the
result is byte for byte a one-machine pack's, also after a shard job was SIGKILLed."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
from packhelp import (
    make_tree,
    noise_tree,
    slow_driver_writes,
    start_driver,
    wait_for,
    write,
)
from packhelp import set_digests as digests

import stoker
from stoker._core.errors import PackError
from stoker.cli import main
from stoker.pack.run.shardjob import run_shard
from stoker.pack.steps import finalize_pack, load_plan, pack_shards, parse_shards, plan_pack

OPTS = {"shard_size": 3, "shuffle": True, "seed": 5, "list_file": True}


@pytest.fixture
def src(tmp_path):
    root = str(tmp_path / "src")
    make_tree(root, {"a": 6, "b": 5, "c": 3})
    write(os.path.join(root, "b", "zero.jpg"), b"")  # a reject in some shard
    write(os.path.join(root, "c", "junk.jpg"), b"not an image at all")
    return root


PLAN_ARGS = ["--shard-size", "30", "--shuffle", "--seed", "5"]


def _done(proc, timeout: float = 120) -> tuple[int, str]:
    """A driver run to its end: exit status and stderr."""
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err.decode(errors="replace")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _reference(tmp_path, src, **opts):
    ref = str(tmp_path / "ref" / "set")
    stoker.pack(src, ref, workers=1, progress=False, **{**OPTS, **opts})
    return digests(ref)


def test_steps_in_any_order_and_split_give_the_one_machine_bytes(tmp_path, src):
    want = _reference(tmp_path, src)
    assert len([n for n in want if n.endswith(".rec")]) == 6
    rng = random.Random(0)
    for i, splits in enumerate([["5", "4", "3", "2", "1", "0"], ["3:", ":1", "1:3"]]):
        out = str(tmp_path / f"out{i}" / "set")
        plan = plan_pack(src, out, **OPTS)
        rng.shuffle(splits)
        for part in splits:
            pack_shards(plan, part, workers=1, progress=False)
        report = finalize_pack(plan, progress=False)
        assert (report.written, report.rejected) == (14, 2)
        assert digests(out) == want, splits
        leftovers = sorted(n for n in os.listdir(os.path.dirname(out)) if "pack-shard" in n)
        assert leftovers == []  # the side-cars go once the manifest is written


def test_plan_file_is_deterministic_and_json(tmp_path, src):
    out = str(tmp_path / "o" / "set")
    first = _read(plan_pack(src, out, **OPTS))
    again = _read(plan_pack(src, out, **OPTS))
    assert first == again
    assert first.startswith(b"{") and b'"stoker_plan": 1' in first


def test_a_done_shard_is_skipped_and_a_changed_source_refused(tmp_path, src):
    out = str(tmp_path / "o" / "set")
    plan = plan_pack(src, out, **OPTS)
    first = pack_shards(plan, "0:2", workers=1, progress=False)
    assert first.packed == (0, 1) and first.skipped == ()
    mtime = os.stat(out + "-00000.rec").st_mtime_ns
    again = pack_shards(plan, ":2", workers=1, progress=False)
    assert again.skipped == (0, 1) and again.packed == ()
    assert os.stat(out + "-00000.rec").st_mtime_ns == mtime
    write(os.path.join(src, "a", "new.jpg"), _read(os.path.join(src, "a", "img000.jpg")))
    with pytest.raises(PackError, match="no longer gives this plan.*--plan-only"):
        pack_shards(plan, "2", workers=1, progress=False)


def test_finalize_names_a_missing_or_corrupt_shard_and_a_rerun_repairs_it(tmp_path, src):
    want = _reference(tmp_path, src)
    out = str(tmp_path / "o" / "set")
    plan = plan_pack(src, out, **OPTS)
    pack_shards(plan, "1:", workers=1, progress=False)
    with pytest.raises(PackError, match=r"1 of 6 shard\(s\) not ready: shard 0: not packed"):
        finalize_pack(plan, progress=False)
    pack_shards(plan, "0", workers=1, progress=False)
    rec = out + "-00004.rec"
    data = bytearray(_read(rec))
    data[len(data) // 2] ^= 0xFF  # same size: only the CRCs can tell
    write(rec, bytes(data))
    with pytest.raises(PackError, match=r"shard 4: .*set-00004\.rec.*key"):
        finalize_pack(plan, progress=False)
    assert not os.path.exists(out + ".stoker.json")
    redo = pack_shards(plan, None, workers=1, progress=False)
    assert redo.packed == (4,)  # the damaged one only
    finalize_pack(plan, progress=False)
    assert digests(out) == want


def test_a_shard_job_killed_mid_shard_then_rerun_gives_the_same_bytes(tmp_path):
    src = str(tmp_path / "src")
    noise_tree(src, 60, bad=(7,))
    want = _reference(tmp_path, src, shard_size=30, list_file=False)  # as PLAN_ARGS
    out = str(tmp_path / "o" / "set")
    env = {**os.environ, "PACK_DRIVER_DELAY_S": "0.2"}  # 6 s for the shard: room to land
    # every step through the driver: the plan's fingerprint covers the (slowed) check
    rc, err = _done(start_driver([src, out, *PLAN_ARGS, "--plan-only"]))
    assert rc == 0, err
    plan = out + ".plan.json"
    job = start_driver(["--plan", plan, "--shards", "1", "--workers", "1"], env=env)
    try:
        # the writer buffers a small shard until its commit: its partial exists from the
        # start, and with 0.2 s per image the shard is far from done a second later
        assert wait_for(lambda: os.path.exists(out + "-00001.rec.partial"), job)
        time.sleep(1.0)
        assert job.poll() is None
        os.killpg(job.pid, signal.SIGKILL)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.communicate(timeout=10)
    assert not os.path.exists(out + "-00001.rec")
    rc, err = _done(start_driver(["--plan", plan, "--finalize"]))
    assert rc == 1 and "shard 1: not packed" in err
    rc, err = _done(start_driver(["--plan", plan, "--shards", "0:2", "--workers", "1"]))
    assert rc == 0, err
    rc, err = _done(start_driver(["--plan", plan, "--finalize"]))
    assert rc == 0, err
    assert digests(out) == want


def test_parse_shards_follows_python_slices():
    assert parse_shards("1:3", 5) == range(1, 3)
    assert parse_shards(":", 5) == range(5)
    assert parse_shards("-2:", 5) == range(3, 5)
    assert parse_shards("4", 5) == range(4, 5)
    assert parse_shards(-1, 5) == range(4, 5)
    with pytest.raises(ValueError, match="the plan has 5 shard"):
        parse_shards("5", 5)
    with pytest.raises(ValueError, match="N or A:B"):
        parse_shards("one", 5)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--plan", "P", "--shards", "0", "--shard-size", "3"], "--shard-size: the plan holds"),
        (["--plan", "P"], "one of --shards A:B or --finalize"),
        (["--shards", "1", "S", "O"], "take a plan"),
        (["S", "O", "--address", "127.0.0.1:1"], "--address is for --engine ray"),
        (["--plan", "P", "S", "O", "--finalize"], "takes no SRC or OUT"),
    ],
)
def test_cli_refuses_step_options_that_do_not_fit(argv, says, capsys):
    assert main(["pack", *argv]) == 2
    assert says in capsys.readouterr().err


def _listing(root) -> str:
    """A .jsonl listing of 7 images whose captions grow longer down the list (a variable
    field: its longest length is in the last shard)."""
    from packhelp import image_bytes

    lines = []
    for i in range(7):
        write(os.path.join(root, "img", f"{i}.jpg"), image_bytes((32, 24 + i), seed=i))
        lines.append(f'{{"image": "img/{i}.jpg", "label": {i % 2}, "caption": "{"w" * (3 * i)}"}}')
    path = os.path.join(root, "list.jsonl")
    write(path, ("\n".join(lines) + "\n").encode())
    return path


def _source_set(tmp_path) -> str:
    """A packed listing whose manifest gives no ``max_len`` for its caption (as a set written
    elsewhere may): a convert measures the longest caption itself."""
    src_set = str(tmp_path / "src" / "set")
    stoker.pack(_listing(str(tmp_path / "src")), src_set, workers=1, progress=False)
    with open(src_set + ".stoker.json", encoding="utf-8") as f:
        doc = json.load(f)
    for field in doc["schema"]["fields"]:
        field.pop("max_len", None)
    write(src_set + ".stoker.json", json.dumps(doc).encode())
    return src_set


@pytest.mark.parametrize("fmt", ["wds", "recordio"])
def test_convert_steps_give_the_one_machine_convert_bytes(tmp_path, fmt):
    src_set = _source_set(tmp_path)
    opts = {"format": fmt, "shard_size": 3}
    ref = str(tmp_path / "ref" / "conv")
    stoker.convert(src_set + ".stoker.json", ref, workers=1, progress=False, **opts)
    out = str(tmp_path / "out" / "conv")
    plan = plan_pack(src_set + ".stoker.json", out, convert=True, **opts)
    with open(plan, encoding="utf-8") as f:
        assert '"convert": true' in f.read()
    options, p, fp = load_plan(plan)
    for s in (1, 2):  # read in this process, as a Ray task does
        assert not run_shard(options, p, fp, s).skipped
    assert pack_shards(plan, "0", workers=1, progress=False).packed == (0,)  # a pool
    report = finalize_pack(plan, progress=False)
    assert report.written == 7 and report.action == "converted"
    assert digests(out) == digests(ref)
    with open(out + ".stoker.json", encoding="utf-8") as f:
        caption = [f for f in json.load(f)["schema"]["fields"] if f["name"] == "caption"]
    assert caption[0]["max_len"] == 18  # the longest, in the last shard


def _pools_started(monkeypatch) -> list[int]:
    """The worker counts of the shard-job pools the local engine starts from now on (the
    real pool runs; this only notes its size)."""
    import stoker.pack.run.pool as pool_module

    started: list[int] = []
    real = pool_module.Pool

    class Noted(real):  # type: ignore[misc,valid-type]
        def __init__(self, n, *a, **k):
            started.append(n)
            super().__init__(n, *a, **k)

    monkeypatch.setattr(pool_module, "Pool", Noted)
    return started


def test_a_quick_convert_is_written_without_starting_processes(tmp_path, monkeypatch):
    """Starting a pool costs more than a convert of a few records: with 2 workers its
    shards are written in this process, to the bytes of one worker."""
    src_set = _source_set(tmp_path)
    ref, out = str(tmp_path / "ref" / "conv"), str(tmp_path / "out" / "conv")
    stoker.convert(src_set + ".stoker.json", ref, workers=1, shard_size=3, progress=False)
    started = _pools_started(monkeypatch)
    stoker.convert(src_set + ".stoker.json", out, workers=2, shard_size=3, progress=False)
    assert started == [] and digests(out) == digests(ref)


def test_a_slow_convert_writes_its_other_shards_in_a_pool(tmp_path, monkeypatch):
    """The first shard, written here, took long enough that 2 processes finish the rest
    sooner: they do, to the bytes of one worker."""
    src_set = _source_set(tmp_path)
    ref, out = str(tmp_path / "ref" / "conv"), str(tmp_path / "out" / "conv")
    stoker.convert(src_set + ".stoker.json", ref, workers=1, shard_size=3, progress=False)
    started = _pools_started(monkeypatch)
    slow_driver_writes(monkeypatch)
    stoker.convert(src_set + ".stoker.json", out, workers=2, shard_size=3, progress=False)
    assert started == [2] and digests(out) == digests(ref)


def test_convert_cli_steps(tmp_path, capsys):
    src_set = _source_set(tmp_path)
    ref = str(tmp_path / "ref" / "conv")
    args = ["--format", "tfrecord", "--shard-size", "2", "--shuffle", "--seed", "3"]
    assert main(["convert", src_set + ".stoker.json", ref, *args, "--quiet"]) == 0
    out = str(tmp_path / "out" / "conv")
    plan = str(tmp_path / "conv.plan")  # --plan beside --plan-only: where it goes
    assert (
        main(["convert", src_set + ".stoker.json", out, *args, "--plan-only", "--plan", plan]) == 0
    )
    assert "stoker convert --plan" in capsys.readouterr().out
    for part in ("2:", ":2"):
        assert main(["convert", "--plan", plan, "--shards", part, "--workers", "1", "--quiet"]) == 0
    assert main(["convert", "--plan", plan, "--shards", "0", "--format", "wds"]) == 2
    assert "--format: the plan holds" in capsys.readouterr().err
    assert main(["convert", "--plan", plan, "--finalize", "--quiet"]) == 0
    assert digests(out) == digests(ref)


def test_an_overwrite_by_steps_replaces_the_set_only_at_finalize(src, tmp_path):
    """The steps over a committed set with overwrite: the plan file beside OUT, the shards
    staged beside the set, which stays whole (the old bytes) until finalize moves the new one
    in, manifest last."""
    out = str(tmp_path / "out" / "set")
    stoker.pack(src, out, workers=1, progress=False, shard_size=4)
    old = digests(out)
    ref = str(tmp_path / "ref" / "set")
    stoker.pack(src, ref, workers=1, progress=False, **OPTS)
    plan = plan_pack(src, out, overwrite=True, **OPTS)
    assert plan == out + ".plan.json"
    pack_shards(plan, workers=1, progress=False)
    assert {n: d for n, d in digests(out).items() if n in old} == old  # untouched so far
    finalize_pack(plan, progress=False)
    os.unlink(plan)
    got = digests(out)
    assert got == digests(ref)
    assert not [n for n in os.listdir(os.path.dirname(out)) if n.startswith(".")]


def test_a_stop_between_a_shards_rename_and_its_sidecar_reruns_clean(src, tmp_path, monkeypatch):
    """Ctrl-C (or a SIGTERM's exit) after a shard's files were renamed but before its side-car:
    the journal stays, so the rerun writes that shard again instead of refusing its files."""
    import stoker.pack.run.shardjob as shardjob

    ref = str(tmp_path / "ref" / "set")
    stoker.pack(src, ref, workers=1, progress=False, **OPTS)
    real = shardjob.atomic_write

    def stop_at_the_sidecar(path, *a, **k):
        if str(path).endswith(".pack-shard.json"):
            raise KeyboardInterrupt
        return real(path, *a, **k)

    monkeypatch.setattr(shardjob, "atomic_write", stop_at_the_sidecar)
    out = str(tmp_path / "out" / "set")
    with pytest.raises(KeyboardInterrupt):
        stoker.pack(src, out, workers=1, progress=False, **OPTS)
    assert os.path.exists(out + "-00000.rec") and os.path.exists(out + ".pack-journal.partial")
    monkeypatch.undo()
    stoker.pack(src, out, workers=1, progress=False, **OPTS)
    assert digests(out) == digests(ref)
