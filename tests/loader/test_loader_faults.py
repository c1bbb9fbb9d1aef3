"""Faults a user will hit, with real worker processes: the error names what and where, fast,
and nothing is left behind (the autouse leak check covers segments, children and fds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
from loader_helpers import (
    CustomError,
    CvThreads,
    KillOnce,
    Misbehave,
    driver,
    make_arrays,
    sigkill_driver,
    wait_gone,
)

from stoker import (
    LoaderTimeoutError,
    SharedMemoryError,
    SpecError,
    TooManyBadSamplesError,
    WorkerDiedError,
    WorkerError,
)
from stoker.loader import Loader, cleanup_stale

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_exception_keeps_type_key_and_worker(arrays, workers):
    x, y = arrays
    with Loader((x, y), batch_size=4, transforms=Misbehave("raise", at=17), workers=workers) as ld:
        with pytest.raises(KeyError) as info:
            for _ in ld:
                pass
    e = info.value
    assert isinstance(e, WorkerError)
    assert e.key == 17 and e.index == 17
    assert "key 17" in str(e) and "bad sample 17" in str(e)
    assert "Misbehave" in e.remote_traceback or "loader_helpers" in e.remote_traceback
    # one line; the worker's traceback is the cause Python prints above it (issue 43)
    assert "\n" not in str(e) and e.remote_traceback in str(e.__cause__)
    if workers:
        assert e.worker_id in (0, 1) and f"worker {e.worker_id}" in str(e)


def test_exception_type_with_its_own_constructor_is_kept(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=4, transforms=Misbehave("custom", at=2), workers=1) as ld:
        with pytest.raises(CustomError) as info:
            list(ld)
    assert isinstance(info.value, WorkerError) and info.value.key == 2
    assert "CustomError" in str(info.value)


def test_loader_restarts_after_an_error(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=10, transforms=Misbehave("raise", at=35), workers=2) as ld:
        with pytest.raises(KeyError):
            list(ld)
        ld.set_epoch(0)
        first = next(iter(ld))
        np.testing.assert_array_equal(first.images, x[:10])


@pytest.mark.parametrize("what,signame", [("sigkill", "SIGKILL"), ("segfault", "SIGSEGV")])
def test_dead_worker_reported_fast_with_signal_and_keys(arrays, what, signame):
    x, y = arrays
    with Loader((x, y), batch_size=4, transforms=Misbehave(what, at=9), workers=2) as ld:
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            list(ld)
        elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert f"killed by {signame}" in msg
    assert "while processing key 9 (row 9 of the arrays)" in msg
    assert "9" in msg.split("keys", 1)[1]
    assert elapsed < 2.0 + 1.0  # detection < 2 s; plus the work before the fault


def test_worker_exit_code_reported(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=4, transforms=Misbehave("exit", at=1), workers=1) as ld:
        with pytest.raises(WorkerDiedError, match="exited with code 3"):
            list(ld)


def test_timeout_names_in_flight_keys(arrays):
    x, y = arrays
    with Loader(
        (x, y), batch_size=4, transforms=Misbehave("sleep", at=6), workers=2, timeout=1
    ) as ld:
        t0 = time.monotonic()
        with pytest.raises(LoaderTimeoutError, match=r"no batch in 1 s.*keys \[.*6") as info:
            list(ld)
        assert time.monotonic() - t0 < 5
    assert isinstance(info.value, TimeoutError)


@pytest.mark.parametrize("what", ["shape", "dtype"])
def test_wrong_shape_or_dtype_named_before_writing(arrays, what):
    x, y = arrays
    with Loader((x, y), batch_size=8, transforms=Misbehave(what, at=3), workers=1) as ld:
        with pytest.raises(
            SpecError,
            match=r"key 3 .*got \(12, (9|10), 3\) (uint8|float32), expected \(12, 10, 3\) uint8",
        ):
            next(iter(ld))


def test_wrong_shape_before_a_trailing_normalize_is_named_too(arrays):
    # the chain's last Normalize writes into the batch row itself: what reaches it is checked
    # first, and the error still names the sample
    from stoker.transforms import Compose, Normalize

    x, y = arrays
    chain = Compose([Misbehave("shape", at=3), Normalize()])
    with Loader((x, y), batch_size=8, transforms=chain, workers=1, layout="NCHW") as ld:
        with pytest.raises(SpecError, match=r"key 3 .*got \(12, 9, 3\) uint8") as info:
            next(iter(ld))
    assert "expected (12, 10, 3) uint8" in str(info.value)


def test_wrong_shape_leaves_neighbours_intact_in_skip_mode(arrays):
    x, y = arrays
    with Loader(
        (x, y),
        batch_size=8,
        transforms=Misbehave("shape", at=3),
        workers=2,
        on_error="skip",
        max_bad_fraction=0.5,
    ) as ld:
        b = next(iter(ld))
        assert list(b.keys) == [0, 1, 2, 4, 5, 6, 7]
        np.testing.assert_array_equal(b.images, x[[0, 1, 2, 4, 5, 6, 7]])


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_accounting_and_breaker(arrays, workers, caplog):
    x, y = arrays
    kw = dict(batch_size=8, transforms=Misbehave("raise", at=10), workers=workers, on_error="skip")
    with Loader((x, y), max_bad_fraction=0.05, **kw) as ld:
        keys = [int(k) for b in ld for k in b.keys]
        assert 10 not in keys and len(keys) == 59
        assert ld.stats["bad_samples"] == 1 == len(ld.rejects)
        assert ld.rejects[0]["key"] == 10 and "KeyError" in ld.rejects[0]["reason"]
        assert ld.state_dict()["bad"]["total"] == 1
    assert "skipped sample key 10" in caplog.text
    with Loader((x, y), max_bad_fraction=0.0, **kw) as ld:
        with pytest.raises(TooManyBadSamplesError, match="key 10"):
            list(ld)


def test_break_many_epochs_is_stable(arrays, shm_names):
    x, y = arrays
    me = psutil.Process()
    with Loader((x, y), batch_size=4, workers=2, shuffle=True, seed=0) as ld:
        next(iter(ld))
        kids = {p.pid for p in me.children(recursive=True)}
        fds = len(os.listdir("/proc/self/fd"))
        segs = shm_names()
        for epoch in range(20):
            ld.set_epoch(epoch)
            for i, b in enumerate(ld):
                assert b.epoch == epoch
                if i == 3:
                    break
        assert {p.pid for p in me.children(recursive=True)} == kids
        assert len(os.listdir("/proc/self/fd")) == fds
        assert shm_names() == segs


def test_break_then_continue_resumes_same_epoch(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=4, workers=2) as ld:
        for i, _ in enumerate(ld):
            if i == 2:
                break
        rest = [int(b.keys[0]) for b in ld]
    assert rest[0] == 12 and len(rest) == 12


def test_ring_preflight_checks_memory_not_dev_shm(arrays, monkeypatch):
    # the ring is anonymous shared memory: what counts is the memory available (and the
    # cgroup's room), not /dev/shm's free space
    from stoker.loader import _shm

    x, y = arrays
    monkeypatch.setattr(_shm, "shm_free_bytes", lambda: 1 << 20)  # too small for the ring
    monkeypatch.setattr(_shm, "memory_available_bytes", lambda: 3 << 20)
    big = np.zeros((4, 256, 256, 3), np.uint8)  # 0.75 MiB of arrays: fits /dev/shm's 1 MiB
    with Loader((big, np.zeros(4)), batch_size=4, workers=1) as ld:
        with pytest.raises(
            SharedMemoryError,
            match=r"need .* MiB of memory for 4 batch slots, 3.0 MiB is available.*more memory",
        ):
            next(iter(ld))
        assert ld._ring is None and ld._pool.handles == []
    monkeypatch.setattr(_shm, "memory_available_bytes", lambda: 1 << 40)
    with Loader((big, np.zeros(4)), batch_size=4, workers=1) as ld:
        assert len(next(iter(ld)).images) == 4


def test_array_copy_preflight_checks_dev_shm(monkeypatch):
    from stoker.loader import _shm

    monkeypatch.setattr(_shm, "shm_free_bytes", lambda: 3 << 20)
    big = np.zeros((64, 256, 256, 3), np.uint8)
    with Loader((big, np.zeros(64)), batch_size=4, workers=1) as ld:
        with pytest.raises(
            SharedMemoryError,
            match=r"need .* MiB for 1 array copies, /dev/shm has 3.0 MiB free.*--shm-size",
        ):
            next(iter(ld))


def test_memory_available_is_a_positive_figure():
    from stoker.loader import _shm

    assert 0 < _shm.memory_available_bytes() < 1 << 50


def test_fallocate_failure_is_an_error_not_sigbus(monkeypatch, shm_names):
    import errno

    from stoker.loader import _shm

    def no_space(fd, off, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    before = shm_names()
    with pytest.raises(SharedMemoryError, match="cannot reserve"):
        _shm.create_segment(1 << 20)
    assert shm_names() == before


@pytest.mark.parametrize("full_at_slot", [0, 1])
def test_slots_that_cannot_be_reserved_stop_the_loader_cleanly(
    arrays, monkeypatch, shm_names, full_at_slot
):
    # the control block is reserved before the workers start, the first `prefetch` slots in a
    # thread while they start, the others just before their first task. A /dev/shm that filled
    # up since the preflight is the same clear error at any of them, with the workers stopped, the segment gone, and no task
    # ever naming an unreserved slot
    import errno

    from stoker.loader import _shm, _startup
    from stoker.loader._pool import WorkerPool

    real = _shm.reserve
    calls = []

    def no_space(fd, off, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    def reserve(seg, offset=0, length=None):
        calls.append((offset, length))
        if len(calls) <= 1 + full_at_slot:  # the control block, then the slots before
            return real(seg, offset, length)
        with monkeypatch.context() as m:  # this slot: the disk is full by now
            m.setattr(os, "posix_fallocate", no_space)
            return real(seg, offset, length)

    sent = []
    real_spawn = WorkerPool._spawn

    def spawn(self, wid):
        handle = real_spawn(self, wid)
        send = handle.conn.send

        def recording_send(task):
            sent.append(task)
            return send(task)

        handle.conn.send = recording_send
        return handle

    monkeypatch.setattr(_shm, "reserve", reserve)
    monkeypatch.setattr(WorkerPool, "_spawn", spawn)
    # the workers make the first batch even in a process whose worker server still boots
    # (else the main process makes it and meets the full disk a batch later)
    monkeypatch.setattr(_startup, "server_booting", lambda: False)
    x, y = arrays
    before = shm_names()
    with Loader((x, y), batch_size=4, workers=2) as ld:
        with pytest.raises(SharedMemoryError, match="cannot reserve"):
            next(iter(ld))
        assert ld._pool.handles == [] and ld._ring is None
    (first, control), (_, slot) = calls[0], calls[1]
    assert first == 0 and control > 0 and slot > 0 and len(calls) == 2 + full_at_slot
    assert [c[0] for c in calls[1:]] == [control + k * slot for k in range(full_at_slot + 1)]
    assert {t.slot for t in sent if t is not None} == ({0} if full_at_slot else set())
    assert shm_names() == before


DRIVER = """
import os, sys, time
import numpy as np
from loader_helpers import Misbehave, make_arrays
from stoker.loader import Loader

if __name__ == "__main__":
    x, y = make_arrays(400)
    # the worker that gets sample 40 sleeps in it: it can only notice a dead main by its watch
    ld = Loader((x, y), batch_size=4, workers=2, transforms=Misbehave("sleep", at=40, seconds=60))
    it = iter(ld)
    next(it)
    pids = [w.proc.pid for w in ld._pool.handles]
    print(ld.source.segment.name, *pids, flush=True)  # the arrays: the ring has no name
    for b in it:
        time.sleep(0.01)
"""


def test_ctrl_c_stops_everything():
    proc = driver(DRIVER)
    try:
        line = proc.stdout.readline().split()
        assert line, proc.stderr.read()
        seg, pids = line[0], [int(p) for p in line[1:]]
        assert os.path.exists(f"/dev/shm/{seg}")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
        assert time.monotonic() - t0 < 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "KeyboardInterrupt" in err
    assert not os.path.exists(f"/dev/shm/{seg}")
    assert wait_gone(pids, 5) == []
    assert "leaked" not in err and "resource_tracker" not in err


def test_sigkill_of_main_workers_exit_and_cleanup_removes_segment():
    proc = driver(DRIVER)
    try:
        line = proc.stdout.readline().split()
        assert line, proc.stderr.read()
        seg, pids = line[0], [int(p) for p in line[1:]]
        time.sleep(0.5)  # let a worker get stuck in sample 40
    finally:
        sigkill_driver(proc)
    try:
        assert wait_gone(pids, 10) == []
    finally:
        # nobody could unlink it; the sweep (here, or any loader starting meanwhile) removes it
        cleanup_stale()
    assert not os.path.exists(f"/dev/shm/{seg}")


def test_cleanup_keeps_live_owners(shm_names):
    from stoker.loader import _shm

    seg, mapping = _shm.create_segment(4096)
    try:
        assert seg.name not in cleanup_stale()
        assert seg.name in shm_names()
    finally:
        seg.unlink()
    fake = "stoker_999999999_1_dead"
    open(f"/dev/shm/{fake}", "wb").close()
    cleanup_stale()
    assert not os.path.exists(f"/dev/shm/{fake}")
    reused = f"stoker_{os.getpid()}_1_reused"  # our pid, another start time: a dead owner
    open(f"/dev/shm/{reused}", "wb").close()
    assert reused in cleanup_stale(dry_run=True)
    assert reused in shm_names()
    cleanup_stale()
    assert reused not in shm_names()


def test_two_loaders_at_once(arrays):
    x, y = arrays
    with Loader((x, y), batch_size=8, workers=1) as a, Loader((x, y), batch_size=8, workers=1) as b:
        for ba, bb in zip(a, b):
            np.testing.assert_array_equal(ba.images, bb.images)
        assert a._ring.fileno() != b._ring.fileno()


def test_workers_limit_threads(arrays):
    """cv2 in a worker runs single-threaded (no oversubscription, no fork deadlock)."""
    x, y = make_arrays(8)
    with Loader((x, y), batch_size=8, transforms=CvThreads(), workers=1) as ld:
        b = next(iter(ld))
        assert int(b.images[0, 0, 0, 0]) == 1


def test_a_forked_copy_never_tears_down_the_parents_loader(arrays, monkeypatch, shm_names):
    """A fork of the training process (os.fork, a fork-based DataLoader) inherits the loader
    object and its atexit hook; closing that copy must not stop workers or unlink segments."""
    from stoker.loader import _shm

    x, y = arrays
    with Loader((x, y), batch_size=8, workers=1) as ld:
        next(iter(ld))
        segs = shm_names()
        real = os.getpid()
        monkeypatch.setattr(os, "getpid", lambda: real + 1)
        ld.close()
        _shm.unlink_owned()
        ld.source.close()
        monkeypatch.undo()
        assert shm_names() == segs and len(segs) == 1  # the arrays (the ring has no name)
        assert ld._pool.handles and all(w.proc.is_alive() for w in ld._pool.handles)
        assert len(list(ld)) == 7


def test_threads_busy_in_main_do_not_hang_workers(arrays):
    """A busy thread holding locks in the main process (a training loop, a logger) is never
    forked into a worker: workers come from a clean fork server."""
    import threading

    import cv2

    x, y = arrays
    stop = threading.Event()
    lock = threading.Lock()

    def busy():
        while not stop.is_set():
            with lock:
                cv2.GaussianBlur(x[0], (3, 3), 0)

    t = threading.Thread(target=busy, daemon=True)
    t.start()
    try:
        with Loader((x, y), batch_size=8, transforms=CvThreads(), workers=2, timeout=20) as ld:
            assert sum(len(b) for b in ld) == 60
    finally:
        stop.set()
        t.join()


FD_DRIVER = """
import os, resource
from loader_helpers import make_arrays
from stoker.loader import Loader

if __name__ == "__main__":
    x, y = make_arrays(40)
    ld = Loader((x, y), batch_size=8, workers=4)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 6, hard))
    try:
        for _ in range(2):  # the main process may make the first epoch while workers start
            for _ in ld:
                pass
    except Exception as e:
        print(type(e).__name__, e, flush=True)
    ld.close()
"""


def test_fd_limit_is_a_clear_error():
    """A low ``ulimit -n`` is an error that names the limit, never a hang (in a subprocess:
    running out of descriptors mid-handshake can take the process's worker server down)."""
    proc = driver(FD_DRIVER)
    out, err = proc.communicate(timeout=60)
    assert "LoaderError" in out, out + err
    assert "too many open files (the limit, ulimit -n, is" in out


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("how", ["sigkill", "segfault"])
def test_respawn_loses_and_duplicates_nothing(arrays, tmp_path, workers, how, caplog):
    x, y = arrays
    t = KillOnce(str(tmp_path), at=(0, 29, 59), how=how)
    kw = dict(batch_size=8, transforms=t, shuffle=True, seed=4)
    with Loader((x, y), workers=0, **dict(kw, transforms=None)) as ref:
        expected = [(b.keys.copy(), b.images.copy()) for b in ref]
    with Loader((x, y), workers=workers, on_worker_death="respawn", **kw) as ld:
        got = [(b.keys.copy(), b.images.copy()) for b in ld]
        assert ld.stats["respawns"] == 3
    assert len(got) == len(expected)
    for (k1, i1), (k2, i2) in zip(got, expected):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(i1, i2)
    assert "started a new one" in caplog.text


def test_respawn_gives_up_on_a_chunk_that_kills_twice(arrays):
    x, y = arrays
    with Loader(
        (x, y),
        batch_size=4,
        transforms=Misbehave("sigkill", at=9),
        workers=2,
        on_worker_death="respawn",
    ) as ld:
        with pytest.raises(
            WorkerDiedError,
            match=r"killed by SIGKILL.* again while processing key 9 \(row 9 of the arrays\); its keys in flight: \[.*9",
        ):
            list(ld)


PREEMPT_DRIVER = """
import json, os, sys, time
from loader_helpers import make_arrays
import stoker

if __name__ == "__main__":
    x, y = make_arrays(4000)
    out = sys.argv[1]
    with stoker.Loader((x, y), batch_size=4, workers=2, seed=3, shuffle=True) as ld:
        stoker.on_sigterm(lambda: open(out, "w").write(json.dumps(ld.state_dict())))
        it = iter(ld)
        next(it)
        print(ld.source.segment.name, *[w.proc.pid for w in ld._pool.handles], flush=True)
        for b in it:
            time.sleep(0.01)
"""


def test_sigterm_with_on_sigterm_saves_state_and_stops_cleanly(tmp_path):
    # faults #52: a preempted job gets its hook called (here: the loader state saved), then
    # stops like Ctrl-C: workers gone, no segment left, exit status 143
    state = tmp_path / "state.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, HERE]))
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(PREEMPT_DRIVER), str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline().split()
        assert line, proc.stderr.read()
        seg, pids = line[0], [int(p) for p in line[1:]]
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err
    saved = json.loads(state.read_text())
    assert saved["epoch"] == 0 and saved["batch"] >= 1 and saved["seed"] == 3
    assert not os.path.exists(f"/dev/shm/{seg}")
    assert wait_gone(pids, 5) == []
    assert "leaked" not in err and "Traceback" not in err


def test_on_sigterm_raises_preempted_after_the_hook_and_restores():
    from stoker.loader import Preempted, on_sigterm

    calls = []
    restore = on_sigterm(lambda: calls.append("saved"))
    try:
        with pytest.raises(Preempted) as info:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between two statements: the raise comes first
        assert calls == ["saved"]
        assert info.value.code == 143 and "SIGTERM" in str(info.value)
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(TypeError, match="callable"):
        on_sigterm("save")  # type: ignore[arg-type]
