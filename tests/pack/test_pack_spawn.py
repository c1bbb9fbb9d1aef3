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


def test_a_script_without_a_main_guard_is_told_to_add_one_instead_of_hanging(tmp_path):
    """A plain script calling stoker.pack at its top level: each forkserver worker would run it
    again (and wait on the pack the script holds: a hang); the pack says so at once, naming the
    line. The same call under ``if __name__ == "__main__":`` packs."""
    import os
    import subprocess
    import sys

    import stoker

    images = stoker.make_sample_data(tmp_path / "img", classes=2, per_class=2, size=16, workers=1)
    call = f"stoker.pack({str(images)!r}, {str(tmp_path / 'out' / 'train')!r}, progress=False)"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "src"))
    runs = {}
    for name, body in (
        ("plain", f"import stoker\n\n{call}\n"),
        ("guarded", f'import stoker\n\nif __name__ == "__main__":\n    {call}\n'),
    ):
        (tmp_path / f"{name}.py").write_text(body)
        runs[name] = subprocess.run(
            [sys.executable, str(tmp_path / f"{name}.py")],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    plain = runs["plain"]
    assert plain.returncode != 0 and "plain.py line 3 runs outside" in plain.stderr
    assert 'if __name__ == "__main__":' in plain.stderr
    assert runs["guarded"].returncode == 0, runs["guarded"].stderr
    assert (tmp_path / "out" / "train.rec").is_file()
