"""stoker where ``fcntl`` and ``ctypes.CDLL(None)`` do not exist (Windows has neither), proven
on Linux: a child interpreter whose ``sitecustomize`` makes ``import fcntl`` an ImportError,
``ctypes.CDLL(None)`` a TypeError (what Windows raises) and removes ``os.register_at_fork``,
``os.getuid``, ``os.pwrite``, ``os.memfd_create``, ``os.posix_fallocate``,
``os.sched_getaffinity``, ``os.O_CLOEXEC``, ``os.O_NOFOLLOW``, ``signal.SIGUSR1`` and
``select.poll`` (also missing there). The
child, and the workers it spawns, import the package and run the default engine (portable
there) with 2 workers over a folder and a RecordIO set: the batches equal a normal process's.

What this does not prove: Windows's own pieces (``LockFileEx``, a named file mapping, the
console's Ctrl-C) run only on Windows; see docs/loader.md, Engines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from loader_helpers import make_folder

import stoker
from stoker.transforms import Resize

SITECUSTOMIZE = r"""
import ctypes, importlib.abc, os, signal, sys
# what the stdlib registers at import, before the hooks go
import logging, multiprocessing.util, random, threading  # noqa: F401

class _NoFcntl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "fcntl":
            raise ImportError("No module named 'fcntl' (simulated: not on this platform)")
        return None

sys.modules.pop("fcntl", None)
sys.meta_path.insert(0, _NoFcntl())
_CDLL = ctypes.CDLL

class _CDLLNoNone(_CDLL):
    def __init__(self, name, *args, **kwargs):
        if name is None:
            raise TypeError("expected str, bytes or os.PathLike object, not NoneType")
        super().__init__(name, *args, **kwargs)

ctypes.CDLL = _CDLLNoNone
for _attr in (
    "register_at_fork", "getuid", "pwrite", "memfd_create", "posix_fallocate", "sched_getaffinity",
    "O_CLOEXEC", "O_NOFOLLOW",
):
    delattr(os, _attr)
del signal.SIGUSR1
import select
del select.poll
"""

CHILD = r"""
import hashlib, json, sys
for blocked in ("import fcntl", "import ctypes; ctypes.CDLL(None)"):
    try:
        exec(blocked)
    except (ImportError, TypeError):
        pass
    else:
        raise SystemExit(f"the simulation leaks: {blocked} works")

import stoker, stoker.loader, stoker.storage
from stoker.transforms import Resize

def digest(source):
    keys, h = [], hashlib.sha256()
    with stoker.Loader(source, batch_size=8, workers=2, shuffle=True, seed=3,
                       transforms=Resize((16, 16))) as ld:
        engine = ld.engine
        for b in ld:
            keys += [str(k) for k in b.keys.tolist()]
            h.update(b.images.tobytes())
            h.update(b.labels.tobytes())
    return {"engine": engine, "keys": keys, "sha": h.hexdigest()}

if __name__ == "__main__":
    out = {name: digest(path) for name, path in zip(("folder", "recordio"), sys.argv[1:3])}
    out["fcntl"] = "fcntl" in sys.modules
    print(json.dumps(out))
"""


def _digest(source) -> dict:
    import hashlib

    keys, h = [], hashlib.sha256()
    with stoker.Loader(
        source, batch_size=8, workers=0, shuffle=True, seed=3, transforms=Resize((16, 16))
    ) as ld:
        for b in ld:
            keys += [str(k) for k in b.keys.tolist()]
            h.update(b.images.tobytes())
            h.update(b.labels.tobytes())
    return {"keys": keys, "sha": h.hexdigest()}


@pytest.fixture(scope="module")
def recordio_set(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("nofcntl")
    make_folder(str(root / "img"), n=24, size=(20, 24))
    report = stoker.pack(root / "img", root / "train", workers=1, progress=False, shard_size=10)
    assert report.manifest.endswith(".stoker.json")
    return report.manifest


@pytest.mark.timeout(120)
def test_the_portable_engine_runs_without_fcntl_and_libc(tmp_path, folder, recordio_set):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    src = os.path.join(os.path.dirname(stoker.__file__), os.pardir)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.path.abspath(src)]),
        "USERNAME": "stoker-test",
    }
    proc = subprocess.run(
        [sys.executable, str(script), folder, recordio_set],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["fcntl"] is False
    for name, source in (("folder", folder), ("recordio", recordio_set)):
        want = _digest(source)
        assert got[name]["engine"] == "portable"
        assert got[name]["keys"] == want["keys"], name
        assert sorted(got[name]["keys"]) == sorted(set(want["keys"])), name
        assert got[name]["sha"] == want["sha"], name
    assert "Traceback" not in proc.stderr, proc.stderr


def test_a_lock_where_the_platform_has_none_is_a_clear_error(monkeypatch, tmp_path):
    """No flock and no LockFileEx: the node registry is off (the loader still runs, as the
    child above shows) and a lock that is required says why."""
    from stoker._core import oscompat
    from stoker.loader import _node

    monkeypatch.setattr(oscompat, "_fcntl", None)
    monkeypatch.setattr(sys, "platform", "simulated")
    assert not oscompat.locks_available()
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(OSError, match="no file locks"):
            oscompat.lock(fd)
    finally:
        os.close(fd)
    assert _node.preflight_and_register(4096, slots=1, workers=2, what="x") is None
