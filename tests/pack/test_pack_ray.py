"""``engine="ray"``: one Ray task per shard gives the local pack's bytes; Ray missing is a
clear error. Marked ``interop`` (`make test-interop`), since they need Ray; the cluster runs
are ``slow`` as well: a real local cluster (a head and a second worker node, started and
stopped here) with 1 and 2 nodes, a worker killed mid-task, a driver SIGKILLed mid-run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from packhelp import make_tree, noise_tree, write
from packhelp import set_digests as digests

import stoker

HERE = os.path.dirname(os.path.abspath(__file__))
RAY = os.path.join(os.path.dirname(sys.executable), "ray")


def _tree(root: str) -> str:
    make_tree(root, {"a": 5, "b": 4, "c": 3})
    write(os.path.join(root, "a", "zero.jpg"), b"")
    return root


#: A driver in its own process (Ray keeps sockets open in a process after ``shutdown``):
#: ``argv``: SRC OUT ADDRESS|"" CHECK|""; prints the report as JSON. With no address it
#: starts Ray itself with ``ray.init(num_cpus=2)`` and checks it is left running.
DRIVER = """
import json, sys
import stoker
src, out, address, check = sys.argv[1:5]
opts = dict(shard_size=SHARD, shuffle=True, seed=4, list_file=True, progress=False)
if check:
    import packhelp
    opts["_check"] = getattr(packhelp, check)
if address:
    report = stoker.pack(src, out, engine="ray", ray_address=address, **opts)
else:
    import ray
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    report = stoker.pack(src, out, engine="ray", **opts)
    assert ray.is_initialized(), "a Ray the caller started is left running"
    ray.shutdown()
print(json.dumps(report.to_json()))
"""
OPTS = {"shuffle": True, "seed": 4, "list_file": True, "progress": False}


def _driver(src: str, out: str, shard: int, address: str = "", check: str = "") -> list[str]:
    code = DRIVER.replace("SHARD", str(shard))
    return [sys.executable, "-c", code, src, out, address, check]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"  # a local test cluster: no token file in the home
    env["PYTHONPATH"] = os.pathsep.join([HERE, env.get("PYTHONPATH", "")])  # packhelp
    return {**env, **extra}


def _report(got: subprocess.CompletedProcess) -> dict:
    assert got.returncode == 0, got.stderr[-3000:]
    return json.loads(got.stdout.strip().splitlines()[-1])


@pytest.mark.interop
def test_ray_engine_gives_the_local_bytes(tmp_path):
    src = _tree(str(tmp_path / "src"))
    ref = str(tmp_path / "ref" / "set")
    stoker.pack(src, ref, workers=1, shard_size=4, **OPTS)
    out = str(tmp_path / "out" / "set")
    got = subprocess.run(
        _driver(src, out, 4), env=_env(), capture_output=True, text=True, timeout=300
    )
    report = _report(got)
    assert (report["written"], report["rejected"], len(report["shards"])) == (12, 1, 4)
    assert digests(out) == digests(ref)


@pytest.mark.interop
def test_a_ray_the_cli_starts_packs_the_local_bytes_without_rays_token_warning(tmp_path):
    """``stoker pack --engine ray`` with no cluster named: the Ray it starts keeps token
    authentication on (its token file is made in the home) and its output carries no warning
    about it; the bytes equal a local pack's."""
    src = _tree(str(tmp_path / "src"))
    ref = str(tmp_path / "ref" / "set")
    stoker.pack(src, ref, workers=1, shard_size=4, **OPTS)
    env = {k: v for k, v in _env(HOME=str(tmp_path / "home")).items() if k != "RAY_AUTH_MODE"}
    out = str(tmp_path / "out" / "set")
    cmd = [sys.executable, "-m", "stoker.cli", "pack", src, out, "--engine", "ray"]
    cmd += ["--workers", "1", "--shard-size", "4", "--shuffle", "--seed", "4", "--list"]
    got = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    assert "Token authentication" not in got.stderr + got.stdout, got.stderr
    assert (tmp_path / "home" / ".ray" / "auth_token").exists()
    assert digests(out) == digests(ref)


def test_without_ray_the_engine_names_the_extra(tmp_path):
    src = _tree(str(tmp_path / "src"))
    code = (
        "import sys; sys.modules['ray'] = None\n"  # `import ray` raises ImportError
        "from stoker.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    out = str(tmp_path / "o" / "set")
    got = subprocess.run(
        [sys.executable, "-c", code, "pack", src, out, "--engine", "ray", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 1
    assert "pip install stoker[ray]" in got.stderr and "Traceback" not in got.stderr
    assert not os.path.exists(out + ".stoker.json")
    local = subprocess.run(  # the local engine never imports Ray
        [
            sys.executable,
            "-c",
            "import sys, stoker; stoker.pack(sys.argv[1], sys.argv[2], workers=1, "
            "progress=False); assert 'ray' not in sys.modules, 'ray imported'",
            src,
            out,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert local.returncode == 0, local.stderr


# ---------------------------------------------------------------- a real local cluster
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Cluster:
    """A head node on 127.0.0.1 and extra worker nodes, each a ``ray start`` process tree
    with one CPU; ``stop()`` is ``ray stop --force``."""

    def __init__(self) -> None:
        self.address = f"127.0.0.1:{_free_port()}"
        self.env = _env(PACK_DRIVER_DELAY_S="0.05")  # slow_check: time to land a kill

    def _ray(self, *args: str) -> None:
        subprocess.run([RAY, *args], env=self.env, check=True, capture_output=True, timeout=180)

    def start_head(self) -> None:
        port = self.address.rsplit(":", 1)[1]
        self._ray(
            "start", "--head", "--port", port, "--num-cpus", "1", "--include-dashboard=false",
            "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
        )  # fmt: skip

    def add_node(self) -> None:
        self._ray(
            "start", "--address", self.address, "--num-cpus", "1",
            "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
        )  # fmt: skip

    def stop(self) -> None:
        subprocess.run(
            [RAY, "stop", "--force"], env=self.env, capture_output=True, timeout=180, check=False
        )


@pytest.fixture
def cluster():
    c = _Cluster()
    try:
        c.start_head()
        yield c
    finally:
        c.stop()


def _task_workers() -> list[psutil.Process]:
    """Ray worker processes running a shard's task (Ray titles them ``ray::shard_task``)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info.get("cmdline") or []
        if cmd and cmd[0].startswith("ray::shard_task"):
            out.append(p)
    return out


def _run(cmd: list[str], env: dict) -> dict:
    return _report(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600))


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.timeout(900)
def test_cluster_with_one_and_two_nodes_and_a_worker_killed_mid_task(tmp_path, cluster):
    src = str(tmp_path / "src")
    noise_tree(src, 80, bad=(3,))
    ref = str(tmp_path / "ref" / "set")
    stoker.pack(src, ref, workers=1, shard_size=10, **OPTS)
    want = digests(ref)
    one = str(tmp_path / "one" / "set")
    _run(_driver(src, one, 10, cluster.address), cluster.env)
    assert digests(one) == want
    cluster.add_node()
    two = str(tmp_path / "two" / "set")
    _run(_driver(src, two, 10, cluster.address), cluster.env)
    assert digests(two) == want
    # a worker killed mid-task: Ray retries the task, the shard comes out the same
    killed = str(tmp_path / "killed" / "set")
    cmd = _driver(src, killed, 10, cluster.address, "slow_check")
    proc = subprocess.Popen(cmd, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        victims: list[psutil.Process] = []
        deadline = time.monotonic() + 180
        while not victims and proc.poll() is None and time.monotonic() < deadline:
            folder = tmp_path / "killed"
            busy = folder.exists() and any(n.endswith(".partial") for n in os.listdir(folder))
            victims = _task_workers() if busy else []
            time.sleep(0.02)
        assert victims, "no shard task seen running"
        victims[0].send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()[-3000:]
    assert digests(killed) == want


@pytest.mark.slow
@pytest.mark.interop
@pytest.mark.timeout(900)
def test_a_driver_killed_mid_run_resumes_and_keeps_finished_shards(tmp_path, cluster):
    cluster.add_node()
    src = str(tmp_path / "src")
    noise_tree(src, 80)
    ref = str(tmp_path / "ref" / "set")
    stoker.pack(src, ref, workers=1, shard_size=10, **OPTS)
    out = str(tmp_path / "out" / "set")
    cmd = _driver(src, out, 10, cluster.address, "slow_check")
    driver = subprocess.Popen(
        cmd, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        folder = tmp_path / "out"
        while time.monotonic() < deadline and driver.poll() is None:
            if folder.exists() and any(n.endswith(".pack-shard.json") for n in os.listdir(folder)):
                break
            time.sleep(0.02)
        assert driver.poll() is None, driver.communicate()[1].decode()[-2000:]
        os.killpg(driver.pid, signal.SIGKILL)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        driver.communicate(timeout=30)
    assert not os.path.exists(out + ".stoker.json")
    report = _run(cmd, cluster.env)  # the same command again
    assert report["resumed"] >= 10  # at least the finished shard was kept, not packed again
    assert digests(out) == digests(ref)
