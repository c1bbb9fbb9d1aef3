"""Packer process faults (faults.md B2 #19-#22): a crashing decoder, SIGKILL and resume,
Ctrl-C / SIGTERM, a file-size limit. Signal tests run the real CLI in a child process."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
from packhelp import (
    CRASH_MARKER,
    DRIVER,
    assert_gone,
    crash_on_marker,
    family,
    file_size,
    make_tree,
    noise_tree,
    semaphores,
    sha,
    start_driver,
    unlink_orphan_semaphores,
    wait_for,
    write,
)

from stoker.formats.recordio import verify_records
from stoker.formats.recordio.seam import RecordIOReader
from stoker.pack import pack


def test_worker_segfault_rejects_that_file_only(tmp_path):  # B2 #21
    src = tmp_path / "src"
    make_tree(str(src), {"a": 30, "b": 30})
    write(str(src / "a" / "img015x.jpg"), CRASH_MARKER + b"\x00" * 64)
    t0 = time.perf_counter()
    r = pack(src, tmp_path / "out", workers=2, _check=crash_on_marker)
    assert time.perf_counter() - t0 < 30
    assert r.written == 60 and r.reasons == {"decoder_crash": 1}
    with open(r.rejects_path) as f:
        rows = f.read().splitlines()[1:]
    assert [row.split("\t")[1:3] for row in rows] == [["a/img015x.jpg", "decoder_crash"]]
    assert verify_records(r.manifest).ok
    with RecordIOReader(r.manifest) as rec:
        assert len(rec) == 60
        keys = rec.keys().tolist()
        assert 16 not in keys  # the crashing file's key is the gap
        # every other file is there, in order, with its own bytes and label
        files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.jpg"))
        files.remove("a/img015x.jpg")
        for i, rel in enumerate(files):
            img, label = rec.read(i)
            assert bytes(img) == (src / rel).read_bytes()
            assert label == (0 if rel.startswith("a/") else 1)


def _kill_resume_run(tmp_path, kill_at: list[float]) -> None:
    src = tmp_path / "src"
    n = noise_tree(str(src), 300, bad=(5, 150, 290))
    out = str(tmp_path / "out")
    clean = pack(src, _clean_dir(tmp_path) / "out", workers=2, _check=None)
    for k, frac in enumerate(kill_at):
        sems = semaphores()
        proc = start_driver([str(src), out, "--workers", "2"])
        target = frac * clean.bytes_out
        reached = wait_for(lambda t=target: file_size(out + ".rec.partial") >= t, proc)
        procs = family(proc)
        if k % 2 == 0:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group, as a terminal or OOM would
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the main process alone: workers must follow
        proc.communicate()
        assert_gone(procs)
        if k % 2 == 0:  # the group's kill took the semaphores' tracker too (docs/pack.md)
            unlink_orphan_semaphores(sems)
        assert reached, "the run finished before the kill point"
        # nothing complete-looking: the manifest comes last; shard files appear only when a
        # kill lands while the run commits, and then the journal is still there
        assert not os.path.exists(out + ".stoker.json")
        if any(os.path.exists(out + ext) for ext in (".rec", ".idx", ".crc32c", ".rejects.tsv")):
            assert os.path.exists(out + ".pack-journal.partial")
    proc = subprocess.Popen(
        [sys.executable, DRIVER, str(src), out, "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()  # the one shard is written again if not whole
    report = verify_records(out + ".stoker.json")
    assert report.ok, [str(p) for p in report.problems]
    with RecordIOReader(out + ".stoker.json") as rec:
        written = len(rec)
    with open(out + ".rejects.tsv") as f:
        rejected = len(f.read().splitlines()) - 1
    assert written + rejected == n and rejected == 3
    _assert_same_as_clean(out, str(tmp_path / "clean" / "out"))
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]


def _clean_dir(tmp_path):
    """Where the clean run goes: its own folder, so that its prefix is ``out`` as well (the
    manifest names its shard files)."""
    (tmp_path / "clean").mkdir()
    return tmp_path / "clean"


def _assert_same_as_clean(out: str, clean: str) -> None:
    """Every output equals the clean run's, the manifest included: it holds no field about
    the run itself (no time, host or path), so a resumed run's must be byte-identical."""
    for ext in (".rec", ".idx", ".crc32c", ".rejects.tsv", ".stoker.json"):
        assert sha(out + ext) == sha(clean + ext), ext


def test_sigkill_then_resume_equals_a_clean_run(tmp_path):  # B2 #19
    _kill_resume_run(tmp_path, [0.2, 0.5])


@pytest.mark.slow
@pytest.mark.parametrize("points", [[0.1], [0.5, 0.6], [0.05, 0.3, 0.6], [0.55]])
def test_sigkill_more_points(tmp_path, points):  # B2 #19, more kill points
    _kill_resume_run(tmp_path, points)


@pytest.mark.parametrize(  # SIGTERM by default in test_sigterm_to_the_group_at_many_moments
    ("sig", "code"),
    [(signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow)],
)
def test_interrupt_stops_workers_and_leaves_no_set(tmp_path, sig, code):  # B2 #20
    src = tmp_path / "src"
    # ~3 MB of records: the shard's writer flushes about 1 MB at a time, so the partial holds
    # bytes for the last two thirds of the run, not only for the moment before its commit
    noise_tree(str(src), 300)
    out = str(tmp_path / "out")
    proc = start_driver([str(src), out, "--workers", "2"])
    reached = wait_for(lambda: file_size(out + ".rec.partial") > 0, proc)
    if not reached:
        proc.kill()
        proc.communicate()
    assert reached, "the run finished before the partial had bytes"
    procs = family(proc)
    t0 = time.monotonic()
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == code, err.decode()
    assert b"rerun to resume" in err
    assert_gone(procs)
    # the one shard was not whole: nothing of it stays, and no set is named
    assert not os.path.exists(out + ".rec.partial") and not os.path.exists(out + ".stoker.json")
    if sig == signal.SIGINT:  # the partials resume
        proc = start_driver([str(src), out, "--workers", "2"])
        proc.communicate(timeout=120)
        assert proc.returncode == 0 and verify_records(out + ".stoker.json").ok


def _sigterm_many_times(tmp_path, runs: int, per_pack: int = 8) -> None:
    """SIGTERM to the whole process group at ``runs`` moments, ``per_pack`` on each of a few
    resumed-again-and-again packs (the first as soon as the run has started, before any
    record; then a step further into the output each time): each exits 143 within 10 s,
    leaves no process and keeps its partials; each pack's last rerun equals a clean run,
    manifest included."""
    src = tmp_path / "src"
    # no delay in the checks and ~20 KB files: the workers spend their time sending results
    # of ~1 MB per chunk, so a kill often lands while one is half sent (what used to hang)
    noise_tree(str(src), 1500, bad=(5, 750, 1490), size=96)
    clean = pack(src, _clean_dir(tmp_path) / "out", workers=2, _check=None)
    env = {**os.environ, "PACK_DRIVER_DELAY_S": "0"}
    # a killed run writes on for a moment (its last flush): about 1 MB more than its step, more
    # on a loaded machine; the steps take a quarter of the output so the last point is reached
    step = max(1, int(0.25 * clean.bytes_out / (per_pack - 1)))
    kills = 0
    for k in range(runs):
        out = str(tmp_path / f"pack{k // per_pack}" / "out")
        if k % per_pack == 0 or os.path.exists(out + ".stoker.json"):  # a fresh pack
            shutil.rmtree(os.path.dirname(out), ignore_errors=True)
            os.makedirs(os.path.dirname(out))
        proc = start_driver([str(src), out, "--workers", "2"], env=env)
        if k % per_pack == 0:
            point = lambda out=out: os.path.exists(out + ".pack-journal.partial")  # noqa: E731
        else:  # past the bytes the last run left: this one is running (its handler is set)
            t = file_size(out + ".rec.partial") + step
            point = lambda t=t, out=out: file_size(out + ".rec.partial") >= t  # noqa: E731
        reached = wait_for(point, proc)
        procs = family(proc)
        t0 = time.monotonic()
        if not reached:  # a resume redid less than the bytes a killed run had left: it ended
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, (k, err.decode())
            _assert_same_as_clean(out, str(tmp_path / "clean" / "out"))
            continue
        kills += 1
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"run {k}: still running 10 s after SIGTERM") from None
        took = time.monotonic() - t0
        assert proc.returncode == 143, (k, proc.returncode, err.decode())
        assert took < 10, (k, took)
        assert_gone(procs)
        assert not os.path.exists(out + ".stoker.json") and not os.path.exists(out + ".rec")
        if k % per_pack == per_pack - 1 or k == runs - 1:
            proc = start_driver([str(src), out, "--workers", "2"], env=env)
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            _assert_same_as_clean(out, str(tmp_path / "clean" / "out"))
    assert kills >= 3 * runs // 4, f"only {kills} of {runs} runs were still going at their moment"


def test_sigterm_to_the_group_at_many_moments(tmp_path):  # B2 #20, the hang after SIGTERM
    _sigterm_many_times(tmp_path, 2)  # a bounded sample; 40 under slow


@pytest.mark.slow
def test_sigterm_to_the_group_40_times(tmp_path):
    _sigterm_many_times(tmp_path, 40)


def _limit_fsize():  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_file_size_limit_names_the_output(tmp_path):  # B2 #22 (EFBIG)
    src = tmp_path / "src"
    noise_tree(str(src), 200)  # about 2 MB of records
    out = str(tmp_path / "out")
    proc = start_driver([str(src), out, "--workers", "2"], preexec_fn=_limit_fsize)
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode == 1, text
    assert "out.rec" in text and "EFBIG" in text, text
    assert [p for p in os.listdir(tmp_path) if p.startswith("out")] == []
