"""A real Ctrl-C: SIGINT to the process group of a script in the middle of ``model.fit``.

The script is what a user writes (no ``with``, no ``close()``): the interrupt must end it with
``KeyboardInterrupt`` and leave no worker process and no shared-memory segment behind. It runs
under ``KERAS_BACKEND=tensorflow`` (where ``tf.data`` threads call the dataset) and ``torch``.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {here!r})
    import keras
    import stoker
    from stoker.keras import KerasDataset
    from keras_data import quadrant_images

    class Report(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            print("BATCH", batch, flush=True)
            time.sleep(0.05)

    def main():
        x, y = quadrant_images(2048, 32)
        loader = stoker.Loader((x, y), batch_size=32, shuffle=True, seed=0, workers=2)
        model = keras.Sequential([
            keras.Input((32, 32, 1)), keras.layers.Flatten(), keras.layers.Dense(4)
        ])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(KerasDataset(loader), epochs=100, verbose=0, callbacks=[Report()])

    if __name__ == "__main__":
        main()
    """
)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:  # it may exit while we look
        return []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "backend",
    # the tensorflow backend's run (10 s) under slow: the adapter's stop is the same code
    [pytest.param("tensorflow", marks=pytest.mark.interop), "torch"],
)
def test_ctrl_c_during_fit_leaves_no_process_and_no_segment(tmp_path, backend):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(here=here))
    env = dict(
        os.environ,
        PYTHONPATH=os.path.join(root, "src"),
        KERAS_BACKEND=backend,  # fixed when keras is first imported: one process each
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, like a job in a terminal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even if ignored here
        env=env,
    )
    try:
        deadline = time.monotonic() + 90
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("BATCH 3") or time.monotonic() > deadline:
                break
        assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
        tree = psutil.Process(proc.pid).children(recursive=True)
        workers = [p.pid for p in tree if "forkserver" not in " ".join(_cmdline(p))]
        segments = glob.glob(f"/dev/shm/stoker_{proc.pid}_*")
        assert segments, "the script's loader should hold shared memory while it trains"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-2000:]
    gone, alive = psutil.wait_procs(tree, timeout=10)
    assert alive == [], f"left running after Ctrl-C: {alive} (workers were {workers})"
    assert glob.glob(f"/dev/shm/stoker_{proc.pid}_*") == []
