"""Pack and convert on the ``spawn`` start method, the one macOS and Windows pools get (no
fork there): every shard job and image task crosses to the workers as a pickle, nothing is
inherited from the parent, and the bytes are the golden ones (``test_pack_golden.py``)."""

from __future__ import annotations

import pytest
from packhelp import set_digests, slow_driver_writes
from test_pack_golden import GOLDEN, OPTS, _digest, inputs  # noqa: F401 - the fixture

from stoker.pack._procs import default_start_method, pool_context
from stoker.pack.engines.jobs import LocalEngine, run_jobs
from stoker.pack.plan.options import PackOptions


@pytest.mark.parametrize(
    ("kind", "fmt"), [("folder", "recordio"), ("listing", "tfrecord"), ("convert", "wds")]
)
def test_spawned_workers_give_the_golden_bytes(
    inputs,  # noqa: F811
    tmp_path,
    monkeypatch,
    kind,
    fmt,
):
    import stoker.pack.run.pool as pool

    started: list[str] = []

    def context(method=None):
        ctx = pool_context(method)
        started.append(ctx.get_start_method())
        return ctx

    monkeypatch.setattr(pool, "pool_context", context)
    if kind == "convert":
        slow_driver_writes(monkeypatch)  # else its first shard, written here, ends it all
    out = str(tmp_path / "set")
    extra = {"convert": True} if kind == "convert" else {"list_file": True}
    options = PackOptions(inputs[kind], out, format=fmt, workers=2, **OPTS, **extra)
    engine = LocalEngine(2, start_method="spawn")
    run_jobs(options, engine)
    assert started and set(started) == {"spawn"}  # the pools that ran were spawned
    assert _digest(out) == GOLDEN[kind, fmt], (kind, fmt, set_digests(out))


def test_the_start_method_is_chosen_in_one_place():
    assert default_start_method() in ("forkserver", "spawn")
    assert pool_context("spawn").get_start_method() == "spawn"
    with pytest.raises(ValueError, match="start_method must be one of"):
        LocalEngine(2, start_method="fork")


def test_a_script_read_from_standard_input_is_told_to_save_it_to_a_file(tmp_path):
    """Python's multiprocessing runs the main script again in each worker; one read from
    standard input (``python -``) cannot be, and each worker would die as it starts: the pack
    says so at once instead of rejecting every image as a decoder crash."""
    import os
    import subprocess
    import sys

    import stoker

    images = stoker.make_sample_data(tmp_path / "img", classes=2, per_class=2, size=16, workers=1)
    out = tmp_path / "out" / "train"
    script = (
        f"import stoker\nstoker.pack({str(images)!r}, {str(out)!r}, workers=2, progress=False)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "src"))
    run = subprocess.run(
        [sys.executable, "-"], input=script, capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode != 0
    assert "'<stdin>' is not a file" in run.stderr and "save it to a file" in run.stderr
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")
