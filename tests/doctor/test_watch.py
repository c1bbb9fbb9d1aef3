"""stoker.watch: data-wait share, pass-through, and the stall watchdog."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import stoker
from stoker.doctor import WatchStats, watch


def slow_source(n: int, data_s: float):
    """A generator whose next() takes ``data_s`` (the data pipeline is late)."""
    for i in range(n):
        if data_s:
            time.sleep(data_s)
        yield i


@pytest.mark.parametrize(("data_ms", "work_ms"), [(8.0, 12.0), (15.0, 5.0), (0.0, 10.0)])
def test_wait_share_matches_known_sleeps(data_ms, work_ms):
    out = io.StringIO()
    w = watch(slow_source(25, data_ms / 1e3), file=out)
    for _ in w:
        time.sleep(work_ms / 1e3)
    s = w.stats
    assert isinstance(s, WatchStats)
    assert s.steps == 25
    expected = data_ms / (data_ms + work_ms)
    assert abs(s.wait_share - expected) <= 0.05, (s.wait_share, expected)
    assert s.wait_p50_s == pytest.approx(data_ms / 1e3, abs=3e-3)
    assert s.wait_p99_s >= s.wait_p50_s
    assert s.batches_per_s == pytest.approx(1e3 / (data_ms + work_ms), rel=0.25)
    # the end-of-pass report went to `file`
    text = out.getvalue()
    assert "epoch 0: 25 steps" in text and f"data wait {100 * s.wait_share:.1f} %" in text


def test_items_order_len_and_attributes_pass_through():
    class Source:
        batch_size = 7

        def __init__(self):
            self.data = list(range(10))

        def __iter__(self):
            return iter(self.data)

        def __len__(self):
            return len(self.data)

    src = Source()
    w = watch(src, file=None)
    assert len(w) == 10
    assert w.batch_size == 7  # forwarded
    assert list(w) == list(range(10))
    assert list(w) == list(range(10))  # a second pass
    assert [e.epoch for e in w.epochs] == [0, 1]
    assert all(e.steps == 10 for e in w.epochs)
    assert w.stats == w.epochs[-1]


def test_sync_time_counts_as_work_not_wait():
    calls = []

    def sync():
        calls.append(1)
        time.sleep(0.005)  # the GPU finishing queued work

    w = watch(range(20), sync=sync, file=None)
    for _ in w:
        pass
    assert len(calls) == 21  # once before every request, the last one ends the pass
    s = w.stats
    assert s.wait_share < 0.05
    assert s.work_s == pytest.approx(20 * 0.005, rel=0.5)


def test_report_every_and_break_keeps_partial_stats():
    out = io.StringIO()
    w = watch(range(100), report_every=10, file=out)
    for i in w:
        if i == 34:
            break
    text = out.getvalue()
    assert text.count("so far") == 3  # after steps 10, 20, 30
    assert "epoch 0: 35 steps" not in text  # no end-of-pass report for a pass left early
    assert w.epochs[-1].steps == 35


def test_bad_arguments():
    with pytest.raises(TypeError):
        watch(5)
    with pytest.raises(ValueError):
        watch([], stall_timeout=0)
    with pytest.raises(ValueError):
        watch([], report_every=0)
    with pytest.raises(TypeError):
        watch([], sync="cuda")


def test_stoker_watch_is_the_same_function():
    assert stoker.watch is watch


def _stuck_in_the_decoder():
    time.sleep(0.9)


def stalling_source():
    yield 0
    yield 1
    _stuck_in_the_decoder()  # the injected stall
    yield 2
    yield 3


def test_watchdog_prints_the_stalled_frame():
    out = io.StringIO()
    w = watch(stalling_source(), stall_timeout=0.25, file=out)
    got = list(w)
    assert got == [0, 1, 2, 3]  # the watchdog reports; it does not interrupt
    text = out.getvalue()
    assert "STALL: no batch for" in text
    assert "_stuck_in_the_decoder" in text  # the frame where the data source is stuck
    assert "the training loop, blocked in next()" in text
    assert text.count("STALL") == 1  # once per stalled step
    assert w.stats.stalls == 1


def test_no_watchdog_output_without_a_stall():
    out = io.StringIO()
    w = watch(slow_source(5, 0.01), stall_timeout=0.5, file=out)
    assert list(w) == list(range(5))
    assert "STALL" not in out.getvalue()
    assert w.stats.stalls == 0


WORKER = textwrap.dedent(
    """
    import faulthandler, signal, sys, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    def decode_forever_in_worker():
        print("ready", flush=True)
        time.sleep(30)

    decode_forever_in_worker()
    """
)


class _LoaderWithWorkers:
    """A source that exposes ``worker_pids()`` like stoker's Loader, and stalls."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def worker_pids(self):
        return [self.pid]

    def __iter__(self):
        yield 0
        time.sleep(0.8)
        yield 1


def test_watchdog_asks_loader_workers_for_their_stacks():
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        out = io.StringIO()
        w = watch(_LoaderWithWorkers(proc.pid), stall_timeout=0.2, file=out)
        assert list(w) == [0, 1]
        assert f"loader workers [{proc.pid}]: asked to print their stacks" in out.getvalue()
        time.sleep(0.2)
    finally:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    # faulthandler in the worker printed where it was
    assert "decode_forever_in_worker" in err


def test_keras_callback_measures_data_wait_inside_fit():
    os.environ.setdefault("KERAS_BACKEND", "torch")
    import keras

    class SlowData(keras.utils.PyDataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            time.sleep(0.02)  # the data side is slow
            return np.ones((4, 3), np.float32), np.ones((4, 1), np.float32)

    class SlowStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.02)  # and so is the step

    data = SlowData()
    out = io.StringIO()
    w = watch(data, file=out)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(data, epochs=2, verbose=0, callbacks=[SlowStep(), w.keras_callback()])
    assert [e.steps for e in w.epochs] == [12, 12]
    share = w.epochs[-1].wait_share
    assert 0.3 < share < 0.7, share  # about half: 20 ms of data per 20 ms of step
    assert out.getvalue().count("steps in") == 2


def test_default_report_goes_to_the_current_stderr(capsys):
    for _ in watch(range(3)):
        pass
    assert "stoker.watch: epoch 0: 3 steps" in capsys.readouterr().err


def test_watchdog_on_a_stalled_stoker_loader(tmp_path):
    from doctor_bottlenecks import StallOnce, make_folder

    from stoker.loader import Loader

    src = make_folder(tmp_path / "imgs", n=16, size=16)
    out = io.StringIO()
    with Loader(src, batch_size=8, transforms=StallOnce(16), workers=1) as loader:
        w = watch(loader, stall_timeout=0.5, file=out)
        assert sum(len(b.images) for b in w) == 16  # the stall passes; nothing is lost
        pids = list(loader.worker_pids()) if hasattr(loader, "worker_pids") else []
    text = out.getvalue()
    assert "STALL: no batch for" in text and "source Loader" in text
    # the training loop's own stack, blocked inside the loader
    loop = text.split("the training loop, blocked in next()")[1]
    assert "stoker/loader/" in loop
    assert "child process(es):" in text  # the workers' state (pid, status, threads)
    if pids:  # a loader that offers worker_pids() is asked for the workers' stacks
        assert f"loader workers {pids}: asked to print their stacks" in text
