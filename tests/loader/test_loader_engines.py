"""The loader's guarantees on both engines (``_engine.py``): the Linux one (fork server,
anonymous memfd ring) and the portable one (spawn, a named ``multiprocessing.shared_memory``
ring, a lifeline pipe instead of ``PR_SET_PDEATHSIG``), which is what macOS and Windows get.

Each guarantee runs on both: every sample exactly once and the same batches as the Linux
engine for a seed, a mid-epoch resume, ``on_error="skip"``, fields, a SIGKILL of the main
process (no worker and no segment outlives it), Ctrl-C; and on the portable engine the errors
spawn makes possible: an unpicklable transform, a script without the ``__main__`` guard. A
portable loader pays a fresh interpreter per worker at its start (about a second here), so
the default run keeps one or two portable loaders per guarantee; other worker counts are
``slow``.
"""

from __future__ import annotations

import os
import signal
import textwrap
import time

import numpy as np
import pytest
from fields_source import FieldsSource, all_batches, assert_same
from loader_helpers import (
    KillOnce,
    Misbehave,
    RandCrop,
    driver,
    invert,
    sigkill_driver,
    wait_gone,
)

import stoker
from stoker.loader import Loader, cleanup_stale
from stoker.loader._named import NAME_MAX, segment_name
from stoker.transforms import Compose, HorizontalFlip, RandomCrop, as_transform

ENGINES = ["linux", "portable"]
KW = dict(batch_size=8, shuffle=True, seed=11, transforms=RandCrop(8, 8))


def _run(data, **kw):
    with Loader(data, **{**KW, **kw}) as ld:
        return [(b.keys.copy(), b.images.copy(), b.labels.copy()) for b in ld]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)


@pytest.fixture(scope="module")
def linux_reference(arrays):
    """One epoch on the Linux engine with 2 workers: what every other run must equal."""
    return _run(arrays, workers=2, engine="linux")


@pytest.mark.parametrize(
    "engine, workers",
    [
        ("linux", 3),
        ("portable", 3),
        pytest.param("portable", 1, marks=pytest.mark.slow),
        pytest.param("portable", 2, marks=pytest.mark.slow),
        pytest.param("portable", 5, marks=pytest.mark.slow),
    ],
)
def test_every_sample_once_and_the_linux_engines_batches(arrays, linux_reference, engine, workers):
    got = _run(arrays, workers=workers, engine=engine)
    _same(got, linux_reference)
    keys = np.concatenate([k for k, _, _ in got])
    assert sorted(keys.tolist()) == list(range(len(arrays[0])))


def test_segment_names_fit_macos_for_any_pid_and_start_time():
    for pid, start in ((1, 0), (4_194_304, 10**12), (99_999_999, 10**15)):
        name = segment_name(pid, start)
        assert name.startswith(f"stoker_{pid}_") and len(name) <= NAME_MAX == 30
    assert len({segment_name(7, 7) for _ in range(50)}) == 50


@pytest.mark.parametrize("engine, other", [("linux", "portable"), ("portable", "linux")])
def test_a_mid_epoch_resume_gives_the_rest(arrays, linux_reference, engine, other):
    """Saved with batches in flight on one engine, resumed on the other: the state is the
    loader's, not the engine's."""
    with Loader(arrays, **KW, workers=2, engine=engine) as ld:
        it = iter(ld)
        next(it)
        next(it)
        state = ld.state_dict()
    with Loader(arrays, **KW, workers=2, engine=other) as ld:
        ld.load_state_dict(state)
        rest = [(b.keys.copy(), b.images.copy(), b.labels.copy()) for b in ld]
    _same(rest, linux_reference[2:])


@pytest.mark.parametrize("engine", ENGINES)
def test_skip_drops_the_bad_sample_alone(arrays, engine):
    t = Compose([Misbehave("raise", at=13), RandCrop(8, 8)])
    kw = dict(transforms=t, on_error="skip", max_bad_fraction=0.5)
    got = _run(arrays, workers=2, engine=engine, **kw)
    want = _run(arrays, workers=0, **kw)
    _same(got, want)
    keys = sorted(np.concatenate([k for k, _, _ in got]).tolist())
    assert keys == [i for i in range(len(arrays[0])) if i != 13]


@pytest.mark.parametrize("engine", ENGINES)
def test_fields_arrive_as_without_workers(engine):
    src = FieldsSource(14)
    t = Compose([RandomCrop(40), HorizontalFlip()])
    runs = []
    for workers in (0, 2):
        with Loader(
            src, batch_size=5, transforms=t, workers=workers, seed=9, shuffle=True, engine=engine
        ) as ld:
            runs.append(all_batches(ld))
    assert_same(runs[0], runs[1])


def test_a_respawned_portable_worker_maps_the_same_ring(arrays, tmp_path):
    """A worker that dies does not take the ring with it (a worker never registers the
    segment with a resource tracker): its replacement maps it by name and nothing is lost."""
    t = Compose([KillOnce(str(tmp_path), at=(17,)), RandCrop(8, 8)])
    kw = dict(transforms=t, on_worker_death="respawn")
    with Loader(arrays, **{**KW, **kw}, workers=2, engine="portable") as ld:
        assert (ld.engine, ld.start_method) == ("portable", "spawn")
        got = [(b.keys.copy(), b.images.copy(), b.labels.copy()) for b in ld]
        assert ld.stats["respawns"] == 1
        ring = ld._ring.name  # a named segment, within macOS's 31 characters with its "/"
        assert len(ring) <= NAME_MAX and os.path.exists(f"/dev/shm/{ring}")
    assert not os.path.exists(f"/dev/shm/{ring}")  # unlinked on close
    _same(got, _run(arrays, workers=0))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_lambda_is_a_clear_error_naming_it(arrays, engine):
    def local(img):
        return img

    for fn, name in ((lambda img: img, "<lambda>"), (local, "local")):
        for t in (Compose([RandCrop(8, 8), as_transform(fn, output="same")]), [RandCrop(8, 8), fn]):
            with Loader(arrays, batch_size=8, workers=2, engine=engine, transforms=t) as ld:
                with pytest.raises(
                    stoker.LoaderError, match=rf"transforms\[1\] \(.*{name}\).*module level"
                ) as e:
                    next(iter(ld))
                assert ld._pool.handles == []  # nothing was started
            assert "\n" not in str(e.value) and f"engine={engine!r}" in str(e.value)


@pytest.mark.parametrize("engine", ENGINES)
def test_plain_functions_are_transforms_alone_in_a_list_and_in_a_chain(arrays, engine):
    """A plain function needs no ``as_transform``: the loader wraps it (its size, which it
    does not say, is learnt from the set's first image)."""
    x, _ = arrays
    for t in (invert, [invert], Compose([RandCrop(8, 8), invert])):
        with Loader(
            arrays, batch_size=8, shuffle=False, workers=1, engine=engine, transforms=t
        ) as ld:
            b = next(iter(ld))
        if isinstance(t, Compose):
            assert b.images.shape == (8, 8, 8, 3)
        else:
            np.testing.assert_array_equal(b.images, 255 - x[:8])


# ----------------------------------------------------------------------------- main dies
DRIVER = """
import os, signal, sys, time
from loader_helpers import Misbehave, make_arrays
from stoker.loader import Loader

if __name__ == "__main__":
    x, y = make_arrays(400)
    # the worker that gets sample 40 sleeps in it: it can only notice a dead main by its watch
    ld = Loader((x, y), batch_size=4, workers=2, engine=sys.argv[1],
                transforms=Misbehave("sleep", at=40, seconds=60))
    it = iter(ld)
    next(it)
    names = [ld.source.segment.name, getattr(ld._ring, "name", "-")]
    if sys.argv[2:] == ["tracker"]:  # it dies too, as with a SIGKILL of the process group
        from multiprocessing import resource_tracker

        os.kill(resource_tracker._resource_tracker._pid, signal.SIGKILL)
    print(*names, *(w.proc.pid for w in ld._pool.handles), flush=True)
    for b in it:
        time.sleep(0.01)
"""


def _start_driver(engine: str, *more: str):
    """The driver on ``engine``, after its first batch: (process, segment paths, worker pids)."""
    proc = driver(DRIVER, engine, *more)
    line = proc.stdout.readline().split()
    assert line, proc.stderr.read()
    segs = [f"/dev/shm/{n}" for n in line[:2] if n != "-"]
    assert all(os.path.exists(s) for s in segs)
    return proc, segs, [int(p) for p in line[2:]]


# the Linux engine's runs of these three are slow here: test_loader_faults and
# test_loader_main_import run the same drivers on it by default
SUBPROCESS_ENGINES = [pytest.param("linux", marks=pytest.mark.slow), "portable"]


@pytest.mark.parametrize("engine", SUBPROCESS_ENGINES)
def test_ctrl_c_stops_everything(engine):
    proc, segs, pids = _start_driver(engine)
    try:
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert "KeyboardInterrupt" in err
    assert wait_gone(pids, 1) == []
    # 2 s of grace for a worker stuck in a sample, then SIGTERM; the rest is interpreter exit
    assert took < 3, took
    assert not any(os.path.exists(s) for s in segs)
    assert "leaked" not in err and "resource_tracker" not in err, err


@pytest.mark.parametrize("engine", SUBPROCESS_ENGINES)
def test_sigkill_of_main_leaves_no_worker_and_no_segment(engine):
    proc, segs, pids = _start_driver(engine)
    time.sleep(0.5)  # let a worker get stuck in sample 40
    sigkill_driver(proc)
    try:
        # a worker busy in a sample notices through its watch (portable: the lifeline's EOF)
        assert wait_gone(pids, 10) == []
    finally:
        cleanup_stale()  # what the next loader start does (the portable ring: or the tracker)
    assert not any(os.path.exists(s) for s in segs)


def test_a_ring_left_by_main_and_its_tracker_is_swept_by_the_next_start():
    """Main and its resource tracker SIGKILLed (a signal to the process group): the portable
    ring's name is left; the next loader start (the node registry's scan, which works where
    no shared-memory name can be listed, as on macOS) unlinks it."""
    from stoker.loader import _node

    proc, segs, pids = _start_driver("portable", "tracker")
    ring = segs[1]
    sigkill_driver(proc)
    try:
        assert wait_gone(pids, 10) == []
        assert os.path.exists(ring)  # nobody else unlinked it
        _node.live_rings()  # what every loader start does before its preflight
        assert not os.path.exists(ring)
    finally:
        cleanup_stale()  # the array source's copy, and the ring should the scan have failed


NO_GUARD = """
from loader_helpers import Misbehave, make_arrays
import stoker

class Here(Misbehave):  # a transform defined in the script: a worker must import the script
    pass

x, y = make_arrays(40)
# respawn: a worker that dies at its start is still not replaced (no storm)
with stoker.Loader((x, y), batch_size=4, workers=2, engine="{engine}",
                   on_worker_death="respawn", transforms={transforms}) as ld:
    n = sum(len(b) for b in ld)
print("delivered", n)
"""


def _no_guard(tmp_path, engine: str, transforms: str):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(NO_GUARD.format(engine=engine, transforms=transforms)))
    proc = driver(None, str(script))
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.parametrize("engine", SUBPROCESS_ENGINES)
def test_a_script_without_the_main_guard_whose_workers_need_it(tmp_path, engine):
    """A transform defined in the script: each worker imports the script to unpickle it,
    which would make a loader of its own. One clear error naming the guard, no hang and no
    storm of processes, on either engine."""
    code, out, err = _no_guard(tmp_path, engine, "Here('none', at=-1)")
    assert code != 0 and "delivered" not in out
    assert (
        "WorkerDiedError" in err and "at its start" in err and 'if __name__ == "__main__":' in err
    )
    # each worker that got as far as the script said why, once: no worker started workers of
    # its own, and none was replaced (at most one message per worker). The first worker to
    # die ends the run: main raises and exits, and a worker still importing the script then
    # goes with it (its lifeline, or PR_SET_PDEATHSIG) before it reaches the Loader line, so
    # one message is as right as two.
    said = err.count("is being made while a worker process imports the main script")
    assert 1 <= said <= 2, err


@pytest.mark.parametrize("engine", SUBPROCESS_ENGINES)
def test_a_script_without_the_main_guard_whose_workers_skip_it_runs(tmp_path, engine):
    """Nothing the workers need is defined in the script: they never import it (the fork
    server's workers, and spawned ones on POSIX), so its imports cost them nothing and a
    missing guard goes unnoticed."""
    code, out, err = _no_guard(tmp_path, engine, "None")
    assert code == 0 and "delivered 40" in out, err


def test_portable_workers_kept_serve_the_next_loader_and_a_new_ring_by_name(folder):
    """keep_workers on the portable engine: the next loader of the same configuration takes
    the workers (no interpreter started) and their ring; one with another ring hands them
    the new ring's name; a Linux-engine loader of the same configuration gets its own. (A
    folder: a loader's own copy of arrays is never kept.)"""
    from stoker.loader import release_workers

    kw = dict(KW, workers=2, engine="portable", keep_workers=30)
    try:
        with Loader(folder, **kw) as ld:
            want = [(b.keys.copy(), b.images.copy(), b.labels.copy()) for b in ld]
            pids, ring = ld.worker_pids(), ld._ring.name
        with Loader(folder, **{**kw, "engine": "linux"}) as ld:
            next(iter(ld))
            assert set(ld.worker_pids()).isdisjoint(pids)  # not the portable pool
        with Loader(folder, **kw) as ld:
            _same([(b.keys.copy(), b.images.copy(), b.labels.copy()) for b in ld], want)
            assert ld.worker_pids() == pids and ld._ring.name == ring  # workers and ring kept
        with Loader(folder, **{**kw, "batch_size": 4, "keep_workers": 0}) as ld:
            got = [(b.keys.copy(), b.images.copy(), b.labels.copy()) for b in ld]
            assert ld.worker_pids() == pids and ld._ring.name != ring  # a new ring, by name
            assert not os.path.exists(f"/dev/shm/{ring}")  # the kept one was unlinked
        assert wait_gone(pids, 5) == []  # closed without keep_workers: stopped
        keys = np.concatenate([k for k, _, _ in got])
        np.testing.assert_array_equal(keys, np.concatenate([k for k, _, _ in want]))
    finally:
        release_workers()
