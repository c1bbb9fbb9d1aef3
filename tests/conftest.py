"""Shared fixtures. The autouse ``no_leaks`` fixture fails any test that leaves behind a
``/dev/shm/stoker_*`` segment, a child process or an open file descriptor. The run's index
and label caches go to a temporary cache directory of its own (``STOKER_CACHE_DIR``, which
subprocesses inherit), never into the user's."""

from __future__ import annotations

import gc
import glob
import os
import shutil
import tempfile
import time

import psutil
import pytest

pytest_plugins = ["figures_plugin", "run_gates"]

SHM_GLOB = "/dev/shm/stoker_*"

_CACHE_DIR: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    """A cache directory for the run; under ``pytest -n`` each worker process has its own, so
    one worker's shard-cache claims never count against another's budget."""
    global _CACHE_DIR
    ours = os.environ.get("STOKER_TEST_CACHE_DIR")
    if "STOKER_CACHE_DIR" not in os.environ or (ours and os.environ["STOKER_CACHE_DIR"] == ours):
        _CACHE_DIR = tempfile.mkdtemp(prefix="stoker-test-cache-")
        os.environ["STOKER_CACHE_DIR"] = os.environ["STOKER_TEST_CACHE_DIR"] = _CACHE_DIR


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE_DIR is not None:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if _alive(p)}


def _alive(p: psutil.Process) -> bool:
    """Zombies count as leaks too (nobody reaped them); only vanished processes do not."""
    try:
        p.status()
        return True
    except psutil.Error:
        return False


def _fds() -> set[int]:
    try:
        return {int(x) for x in os.listdir("/proc/self/fd")}
    except OSError:
        return set()


def _segment_is_ours(path: str, family: set[int]) -> bool:
    """A segment is named stoker_<pid>_...; count it when that pid is this test process, one of
    its children, or no longer alive (a killed child's leftovers). Segments of other live
    processes belong to someone else running tests at the same time."""
    try:
        pid = int(os.path.basename(path).split("_")[1])
    except (IndexError, ValueError):
        return True
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # a parallel pass: a dead process's segment may be another worker's test's (the tests
        # that kill a main run in the pass of their own, ``alone``, where this rule holds)
        return pid in family
    return pid in family or not psutil.pid_exists(pid)


@pytest.fixture(scope="session", autouse=True)
def _worker_server():
    """The loader's workers come from its own fork server, the packer's (and those of a
    transform defined in ``__main__``) from multiprocessing's; both (with the resource
    tracker) live as long as the test process. Start both once, before the
    first test, so the leak check sees them as already there; workers must still be gone
    after each test."""
    import multiprocessing.forkserver
    from multiprocessing import resource_tracker

    from stoker.loader import warm_up

    resource_tracker.ensure_running()
    warm_up()  # the loader's own fork server
    multiprocessing.forkserver.ensure_running()  # multiprocessing's: pack pools and some workers
    yield


def _new_fds(before: set[int]) -> list[tuple[int, str]]:
    """The sockets, pipes and shared-memory files opened since ``before`` and still open (other
    fds may be cached by libraries on first use, e.g. /dev/urandom)."""
    leaked = []
    for fd in sorted(_fds() - before):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("pipe:", "socket:", "/dev/shm/")) or "stoker" in target:
            leaked.append((fd, target))
    return leaked


@pytest.fixture(autouse=True)
def no_leaks(request):
    """Snapshot shm segments, children and fds; after the test, wait briefly and compare."""
    shm_before = set(glob.glob(SHM_GLOB))
    children_before = _children()
    family = {os.getpid()} | children_before
    fds_before = _fds()
    yield
    deadline, collected = time.monotonic() + 5.0, False
    while True:  # children exit, and other threads close their fds, a moment after the test
        kids_now = _children()
        family |= kids_now
        shm_new = {p for p in set(glob.glob(SHM_GLOB)) - shm_before if _segment_is_ours(p, family)}
        kids_new = kids_now - children_before
        leaked_fds = _new_fds(fds_before)
        if not (shm_new or kids_new or leaked_fds) or time.monotonic() > deadline:
            break
        if leaked_fds and not collected:  # an fd an unreachable object still holds
            gc.collect()
            collected = True
        time.sleep(0.05)
    problems = []
    if shm_new:
        problems.append(f"shared-memory segments left: {sorted(shm_new)}")
    if kids_new:
        problems.append(f"child processes left: {sorted(kids_new)}")
    if leaked_fds:
        problems.append(f"file descriptors left: {leaked_fds}")
    if problems:
        for path in shm_new:  # clean up so one leak does not cascade into other tests
            try:
                os.unlink(path)
            except OSError:
                pass
        for pid in kids_new:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        pytest.fail("leak check: " + "; ".join(problems), pytrace=False)


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs CUDA (run scripts/gpu_check.py on a GPU machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


# The fake credentials of the loopback S3 server (tests/storage_doubles.py) must never show in
# anything a test prints or reports: captured output, logs and failure reports are scanned, and
# a run where one shows fails at the end, naming the tests.
_SECRETS_SEEN: list[str] = []


def _fake_secrets() -> tuple[str, ...]:
    from storage_doubles import FAKE_ACCESS_KEY_ID, FAKE_SECRET_ACCESS_KEY

    return (FAKE_SECRET_ACCESS_KEY, FAKE_ACCESS_KEY_ID)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    texts = [content for _, content in report.sections]
    if report.longrepr is not None:
        texts.append(str(report.longrepr))
    if any(secret in text for text in texts for secret in _fake_secrets()):
        _SECRETS_SEEN.append(f"{report.nodeid} ({report.when})")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SECRETS_SEEN:
        print("\nfake credentials appeared in the output of: " + ", ".join(_SECRETS_SEEN))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# ---------------------------------------------------------------------------------------------
# Object storage: one moto S3 server on loopback for the whole run (started when a test first
# asks for it), the AWS variables pointing at it, and every connection a test opened closed
# before the leak check counts sockets.


def open_sockets() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass
    return n


def close_and_wait(baseline: int, deadline: float = 3.0) -> None:
    """Close this process's storage connections, then wait until the server side of each is
    closed too (the server's threads see the client's FIN a moment later)."""
    from stoker.storage.remote import close_filesystems

    close_filesystems()
    end = time.monotonic() + deadline
    while open_sockets() > baseline and time.monotonic() < end:
        time.sleep(0.02)


@pytest.fixture
def storage_closed():
    """For a test that reaches a storage server without the ``s3_bucket`` fixture: its
    storage connections are closed after it, and the servers' side of each too."""
    baseline = open_sockets()
    yield
    close_and_wait(baseline)


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server, in a child process; fsspec's I/O thread (its event loop's self-pipe is
    a socket pair, alive as long as the process) is started first, so the leak check sees both
    as already there."""
    import fsspec.asyn

    from storage_doubles import S3Server

    fsspec.asyn.get_loop()
    with S3Server(process=True) as server:
        yield server


def _clean_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """No credential from the developer's own environment or ~/.aws reaches a test."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def no_aws(monkeypatch, tmp_path):
    """An environment without any AWS credential; connections closed after the test."""
    import fsspec.asyn

    fsspec.asyn.get_loop()  # lives as long as the process (see s3_server)
    baseline = open_sockets()
    _clean_aws_env(monkeypatch, tmp_path)
    yield
    close_and_wait(baseline)


@pytest.fixture
def s3_bucket(s3_server, monkeypatch, tmp_path):
    """The AWS variables set for the session's server, and a fresh bucket's name."""
    import uuid

    from stoker.storage.remote import Remote

    baseline = open_sockets()
    _clean_aws_env(monkeypatch, tmp_path)
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    Remote(f"s3://{bucket}").fs().mkdir(bucket)
    yield bucket
    close_and_wait(baseline)
