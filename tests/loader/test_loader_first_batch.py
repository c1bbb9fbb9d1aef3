"""A process's first loader makes its first batch in the main process while the worker server
is still importing (``loader/_startup.py``): the same bytes as the workers make, workers up
after it, a failing sample still reported by a worker, and only for stoker's own code."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
from test_loader_records import write_rec

from stoker.loader import Loader
from stoker.transforms import Compose, HorizontalFlip, Normalize, RandomCrop, Resize, Transform

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")

# a fresh process, whose loader starts the worker server itself
SCRIPT = """
import json, sys
import numpy as np
from stoker.loader import Loader
from stoker.transforms import Compose, HorizontalFlip, Normalize, RandomCrop, Resize

def run(workers, batch_size=8, **kw):
    chain = Compose([Resize(40), RandomCrop(32), HorizontalFlip(), Normalize()])
    ld = Loader(sys.argv[1], batch_size=batch_size, transforms=chain, layout="NCHW", shuffle=True,
                seed=5, workers=workers, **kw)
    with ld:
        it = iter(ld)
        first = next(it)
        here = first._lease is None  # made into fresh arrays, not a ring slot
        pids = ld.worker_pids()
        rows = [(first.images.copy(), first.labels.copy(), first.keys.copy())]
        rows += [(b.images.copy(), b.labels.copy(), b.keys.copy()) for b in it]
    return here, pids, rows

def same_as_without_workers(got, **kw):
    _, _, want = run(0, **kw)
    return len(got) == len(want) and all(
        all(np.array_equal(a, b) for a, b in zip(g, w)) for g, w in zip(got, want))

mode = sys.argv[2]
if mode == "same":
    here, pids, got = run(2)
    print(json.dumps({"here": here, "workers": len(pids), "same": same_as_without_workers(got)}))
elif mode == "rest":
    # the workers come up once the main process has made `after` chunks of the first batch
    import threading
    from stoker.loader import _startup
    opts = sys.argv[3:]
    after, size = (4, 160) if "late" in opts else (1, 128)
    chunks, fill_chunk = [], _startup.fill_chunk

    def first_chunk_then_the_workers(task, **kw):
        out = fill_chunk(task, **kw)
        chunks.append(len(task.indices))
        for t in threading.enumerate():
            if t.name == "stoker-worker-start" and len(chunks) == after:
                t.join()
        return out

    _startup.fill_chunk = first_chunk_then_the_workers
    kw = {"pair_with": HorizontalFlip()} if "pair_with" in opts else {}
    here, pids, got = run(2, size, **kw)
    made = list(chunks)
    same = same_as_without_workers(got, batch_size=size, **kw)
    print(json.dumps({"here": here, "chunks": made, "workers": len(pids), "same": same}))
else:
    try:
        run(2)
        print(json.dumps({"raised": None}))
    except Exception as e:
        print(json.dumps({"raised": [c.__name__ for c in type(e).__mro__], "text": str(e)}))
"""


def _fresh(path: str, mode: str, *more: str) -> dict:
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), path, mode, *more],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_first_batch_made_here_is_the_workers_bytes(folder):
    out = _fresh(folder, "same")
    assert out["here"], "the first batch of a fresh process came from a worker"
    assert out["workers"] == 2  # started meanwhile: up once the first batch is out
    assert out["same"]  # every batch, the first included, equal to workers=0's


@pytest.fixture(scope="module")
def folder_160(tmp_path_factory) -> str:
    """170 small JPEGs: batches of 128 and 160, made here in chunks of 32."""
    from loader_helpers import make_folder

    root = tmp_path_factory.mktemp("folder_160")
    make_folder(str(root), n=170, size=(36, 40))
    return str(root)


@pytest.mark.parametrize("more", [[], ["pair_with"]])
def test_the_workers_make_the_rest_of_a_batch_begun_here(folder_160, more):
    """Workers up after the main process made part of the first batch take the rest of it:
    the rows made here (and their pairs) are copied into its ring slot, every byte as
    without workers."""
    out = _fresh(folder_160, "rest", *more)
    assert not out["here"], "the first batch was made here alone"
    assert out["chunks"] == [32], "not one chunk made here, then the workers'"
    assert out["workers"] == 2 and out["same"]


def test_a_small_rest_is_made_here_while_the_workers_begin_the_next_batch(folder_160):
    """Workers up with less than a quarter of the first batch left: it is finished here (in
    fresh arrays), the workers making the next batches meanwhile; every byte as without
    workers."""
    out = _fresh(folder_160, "rest", "late")
    assert out["here"], "the first batch came from the ring"
    assert out["chunks"] == [32] * 5, "not 4 chunks, then the rest, made here"
    assert out["workers"] == 2 and out["same"]


@pytest.mark.slow
def test_a_failing_first_sample_is_reported_by_a_worker(tmp_path):
    from loader_helpers import make_folder

    make_folder(str(tmp_path), n=12)
    for name in os.listdir(tmp_path / "class_0"):
        (tmp_path / "class_0" / name).write_bytes(b"\xff\xd8 not a jpeg")
    out = _fresh(str(tmp_path), "error")
    assert out["raised"] is not None and "WorkerError" in out["raised"]


@dataclass(frozen=True)
class _Mine(Transform):
    """A transform of the user's: never run in the main process for the workers."""

    def __call__(self, img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return img

    def output_spec(self, in_spec):
        return in_spec


def _plain(img, rng):
    return img


def test_only_stokers_own_code_runs_in_the_main_process(folder):
    from stoker.loader import Loader
    from stoker.loader._startup import own_code

    chain = [Resize(40), RandomCrop(32), HorizontalFlip(), Normalize()]
    with Loader(folder, batch_size=8, transforms=Compose(chain), workers=0) as ld:
        assert own_code(ld.source, ld.pipeline)
    with Loader(folder, batch_size=8, transforms=Compose([_Mine(), *chain]), workers=0) as ld:
        assert not own_code(ld.source, ld.pipeline)
        assert not own_code(ld.source, Compose([_plain]))  # a plain function of the user's


# what a worker does at its start, in a process that imported what the worker server preloads
UNPICKLE = """
import pickle, sys
from stoker.loader._pool import _PRELOAD
for name in _PRELOAD:
    __import__(name)
before = set(sys.modules)
pickle.loads(sys.stdin.buffer.read())
print(" ".join(sorted(set(sys.modules) - before)))
"""


def test_a_rec_loaders_worker_imports_nothing_the_server_did_not(tmp_path):
    """Every worker a loader starts unpickles its configuration; a module that this imports
    and the worker server did not preload is imported (in an environment without bytecode
    caches, compiled) once per worker instead of once per process."""
    path = str(tmp_path / "train.rec")
    write_rec(path)
    chain = Compose([Resize(40), RandomCrop(32), HorizontalFlip(), Normalize()])
    with Loader(path, batch_size=8, transforms=chain, layout="NCHW", workers=2) as ld:
        next(iter(ld))
        cfg = ld._pool._config
        assert cfg is not None
        # the ring's descriptor crosses only with a worker's start: the rest of the configuration
        data = pickle.dumps((cfg.source, cfg.pipeline, cfg.layout))
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-c", UNPICKLE], input=data, capture_output=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().split() == []


# the worker server's environment, and this process's after the server started
SERVER_ENV = """
import os, time
from stoker.loader import _pool
from stoker.loader._process import SERVER
_pool.warm_up()
proc = f"/proc/{SERVER._forkserver_pid}"
while b"forkserver" not in open(f"{proc}/cmdline", "rb").read():  # not exec'd yet
    time.sleep(0.01)
with open(f"{proc}/environ", "rb") as f:
    server = dict(e.split(b"=", 1) for e in f.read().split(b"\\0") if b"=" in e)
print(server[b"OPENBLAS_NUM_THREADS"].decode(), server[b"OMP_NUM_THREADS"].decode(),
      os.environ["OPENBLAS_NUM_THREADS"], "OMP_NUM_THREADS" in os.environ)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux engine's server")
def test_the_worker_server_imports_numpy_with_one_blas_thread():
    """A BLAS that starts a thread per core when numpy is imported slows the server's boot;
    the workers run one thread each anyway. The caller's environment stays as it was."""
    env = dict(os.environ, PYTHONPATH=SRC, OPENBLAS_NUM_THREADS="4")
    env.pop("OMP_NUM_THREADS", None)
    out = subprocess.run(
        [sys.executable, "-c", SERVER_ENV], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["1", "1", "4", "False"]
