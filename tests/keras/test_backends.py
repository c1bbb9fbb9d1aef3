"""Keras as users run it: ``fit``, ``evaluate`` and ``predict`` under ``KERAS_BACKEND=tensorflow``
(what the seed-002 user trained with) and ``torch``, on loader workers.

Keras fixes its backend at its first import, so each backend runs ``backend_run.py`` in a
process of its own (the rest of this directory runs in-process on torch). The script must
finish well inside its time limit (a freeze dumps every thread's stack and fails the test),
learn, train on every sample once per epoch, give ``predict`` rows in sample order, and leave
no worker process and no shared-memory segment behind, inside the script and after it exits.
TensorFlow is a dev dependency: if it cannot be imported, the tensorflow run fails.
"""

from __future__ import annotations

import glob
import json
import math
import os
import signal
import subprocess
import sys

import psutil
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")
FREEZE_S = 100  # the script dumps its stacks and exits past this (about 5-10 s normally)


@pytest.mark.timeout(FREEZE_S + 40)
@pytest.mark.parametrize(
    "backend",
    # a fresh process per backend, a minute for TensorFlow (its import is most of it) and 40 s
    # for torch: under slow, while the default run fits with workers on torch in test_fit.py
    # and on TensorFlow in test_interrupt.py
    [
        pytest.param("tensorflow", marks=pytest.mark.interop),
        pytest.param("torch", marks=pytest.mark.slow),
    ],
)
def test_fit_evaluate_predict_with_workers_leaves_nothing(backend):
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        PYTHONPATH=os.pathsep.join([SRC, HERE]),
        TF_CPP_MIN_LOG_LEVEL="2",  # TensorFlow's info and warning lines
    )
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "backend_run.py"), str(FREEZE_S)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=FREEZE_S + 20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, f"{backend} run failed or froze:\n{err[-4000:]}"
    r = json.loads(out.strip().splitlines()[-1])
    assert r["backend"] == backend

    loss = r["history"]["loss"]
    assert len(loss) == 3 and loss[-1] < 0.5 * loss[0], r["history"]
    assert r["history"]["val_accuracy"][-1] > 0.5, r["history"]  # 4 classes: chance 0.25
    # the loader's workers did the work (2 for training, 1 for validation), in shared memory;
    # Keras started no pool of its own
    assert 2 <= r["most_processes"] <= 3 and r["most_direct_children"] == 0, r
    assert r["most_segments"] >= 1
    assert r["trained_once"] == [96, 96]  # every sample exactly once in each epoch

    assert set(r["evaluate"]) >= {"loss", "accuracy"}
    assert all(math.isfinite(v) for v in r["evaluate"].values()), r["evaluate"]
    assert r["evaluate"]["accuracy"] > 0.5, r["evaluate"]
    assert r["predict_shape"] == [200, 4]
    assert r["predict_rows_match"]  # the same rows as predict on the arrays, in sample order
    assert r["predict_accuracy"] > 0.5

    assert r["stopped_epochs"] == 1
    assert r["left_processes"] == [] and r["left_segments"] == [], r
    # and after the script has exited, nothing it started is still running
    # (the worker server exits once its parent has gone: give it a moment)
    procs = []
    for pid, created in r["seen_processes"]:
        try:
            p = psutil.Process(pid)
            if abs(p.create_time() - created) < 0.5:  # not a new process with a reused pid
                procs.append(p)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert alive == [], f"{backend}: left running after the script exited: {alive}"
    assert glob.glob(f"/dev/shm/stoker_{proc.pid}_*") == []
