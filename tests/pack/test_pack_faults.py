"""Packer process faults (faults.md B2 #19-#22): a crashing decoder, SIGKILL and resume,
Ctrl-C / SIGTERM, a file-size limit. Signal tests run the real CLI in a child process."""

from __future__ import annotations

import contextlib
import glob
import os
import resource
import signal
import subprocess
import sys
import time

import psutil
import pytest
from packhelp import CRASH_MARKER, crash_on_marker, make_tree, noise_jpeg, sha, write

from stoker.formats.recordio import open_records, verify_records
from stoker.pack import pack

HERE = os.path.dirname(os.path.abspath(__file__))
DRIVER = os.path.join(HERE, "pack_driver.py")


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
    with open_records(r.manifest) as rec:
        assert len(rec) == 60
        keys = rec.keys.tolist()
        assert 16 not in keys  # the crashing file's key is the gap
        # every other file is there, in order, with its own bytes and label
        files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*.jpg"))
        files.remove("a/img015x.jpg")
        for i, rel in enumerate(files):
            header, img = rec.read_header(i)
            assert bytes(img) == (src / rel).read_bytes()
            assert header.label == (0.0 if rel.startswith("a/") else 1.0)


def _noise_tree(root, n: int, bad: tuple[int, ...] = ()) -> int:
    """n noise JPEGs (~10 KB each) in 3 classes; positions in ``bad`` are zero bytes."""
    for i in range(n):
        path = os.path.join(root, f"c{i % 3}", f"{i:04d}.jpg")
        write(path, b"" if i in bad else noise_jpeg(64, seed=i))
    return n


def _start(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, DRIVER, *args, "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **kw,
    )


def _wait_for(pred, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    return False


def _family(proc: subprocess.Popen) -> list[psutil.Process]:
    try:
        return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _assert_gone(procs: list[psutil.Process], timeout: float = 10.0) -> None:
    gone, alive = psutil.wait_procs(procs, timeout=timeout)
    assert not alive, f"left running: {[p.pid for p in alive]}"


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _kill_resume_run(tmp_path, kill_at: list[float]) -> None:
    src = tmp_path / "src"
    n = _noise_tree(str(src), 300, bad=(5, 150, 290))
    out = str(tmp_path / "out")
    clean = pack(src, tmp_path / "clean", workers=2, _check=None)
    for k, frac in enumerate(kill_at):
        sems = set(glob.glob("/dev/shm/sem.mp-*"))
        proc = _start([str(src), out, "--workers", "2"])
        target = frac * clean.bytes_out
        reached = _wait_for(lambda t=target: _size(out + ".rec.partial") >= t, proc)
        family = _family(proc)
        if k % 2 == 0:
            os.killpg(proc.pid, signal.SIGKILL)  # the whole group, as a terminal or OOM would
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the main process alone: workers must follow
        proc.communicate()
        _assert_gone(family)
        if k % 2 == 0:  # the group's kill took the semaphores' tracker too (docs/pack.md)
            for left in set(glob.glob("/dev/shm/sem.mp-*")) - sems:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(left)
        assert reached, "the run finished before the kill point"
        # nothing complete-looking: the manifest comes last; shard files appear only when a
        # kill lands while the run commits, and then the journal is still there
        assert not os.path.exists(out + ".stoker.json")
        if any(os.path.exists(out + ext) for ext in (".rec", ".idx", ".crc32c", ".rejects.tsv")):
            assert os.path.exists(out + ".pack-journal.partial")
    killed_while_committing = os.path.exists(out + ".rec")
    proc = subprocess.Popen(
        [sys.executable, DRIVER, str(src), out, "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    if not killed_while_committing:  # then it starts over; otherwise it continues
        assert b"resumed: " in stdout
    report = verify_records(out + ".stoker.json")
    assert report.ok, [str(p) for p in report.problems]
    with open_records(out + ".stoker.json") as rec:
        written = len(rec)
    with open(out + ".rejects.tsv") as f:
        rejected = len(f.read().splitlines()) - 1
    assert written + rejected == n and rejected == 3
    for ext in (".rec", ".idx", ".crc32c", ".rejects.tsv"):
        assert sha(out + ext) == sha(str(tmp_path / "clean") + ext), ext
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]


def test_sigkill_then_resume_equals_a_clean_run(tmp_path):  # B2 #19
    _kill_resume_run(tmp_path, [0.2, 0.5])


@pytest.mark.slow
@pytest.mark.parametrize("points", [[0.1], [0.5, 0.6], [0.05, 0.3, 0.6], [0.55]])
def test_sigkill_more_points(tmp_path, points):  # B2 #19, more kill points
    _kill_resume_run(tmp_path, points)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_stops_workers_and_keeps_partials(tmp_path, sig, code):  # B2 #20
    src = tmp_path / "src"
    _noise_tree(str(src), 200)
    out = str(tmp_path / "out")
    proc = _start([str(src), out, "--workers", "2"])
    assert _wait_for(lambda: _size(out + ".rec.partial") > 0, proc)
    family = _family(proc)
    t0 = time.monotonic()
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 10
    assert proc.returncode == code, err.decode()
    assert b"rerun to resume" in err
    _assert_gone(family)
    assert os.path.exists(out + ".rec.partial") and not os.path.exists(out + ".rec")
    if sig == signal.SIGINT:  # the partials resume
        proc = _start([str(src), out, "--workers", "2"])
        proc.communicate(timeout=120)
        assert proc.returncode == 0 and verify_records(out + ".stoker.json").ok


def _limit_fsize():  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def test_file_size_limit_names_the_output(tmp_path):  # B2 #22 (EFBIG)
    src = tmp_path / "src"
    _noise_tree(str(src), 200)  # about 2 MB of records
    out = str(tmp_path / "out")
    proc = _start([str(src), out, "--workers", "2"], preexec_fn=_limit_fsize)
    _, err = proc.communicate(timeout=120)
    text = err.decode()
    assert proc.returncode == 1, text
    assert "out.rec" in text and "EFBIG" in text, text
    assert [p for p in os.listdir(tmp_path) if p.startswith("out")] == []
