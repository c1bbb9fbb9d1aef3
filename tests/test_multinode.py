"""Two "nodes" of two ranks each on loopback: ``examples/multinode.py`` launched by torchrun
twice (``--nnodes 2 --node-rank 0|1``), gloo process groups, two loader workers per rank.

Every rank builds its Loader from torch.distributed and all ranks all_gather their keys: each
record is delivered once across nodes x ranks x workers, up to the declared padding, with
equal batch counts. A run stopped at a step on the four ranks and resumed from rank 0's JSON
state on three ranks of one node delivers the epoch once as well (elastic resume; ``slow``:
two torchrun launches; the default run covers elastic resume in tests/loader).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

from stoker.sampling import ShardOrder  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.timeout(150)]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "multinode.py"
N = 30


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[str, list[int]]:
    """30 records in 8 shards of 4 (the last of 2): enough shards for shard order on 4 ranks."""
    import stoker
    from stoker.pack import make_sample_data

    root = tmp_path_factory.mktemp("multinode")
    images = make_sample_data(root / "img", classes=3, per_class=10, size=8, workers=1)
    report = stoker.pack(images, root / "train", workers=1, progress=False, shard_size=4)
    assert report.written == N
    with stoker.Loader(report.manifest, batch_size=1, workers=0) as ld:
        sizes = ld.source.shard_sizes().tolist()
    return str(report.manifest), sizes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nodes: int, per_node: int, *args: str) -> None:
    """One torchrun per node, all on this machine, sharing a master on 127.0.0.1."""
    port = str(_free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                str(nodes),
                "--nproc-per-node",
                str(per_node),
                "--node-rank",
                str(node),
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                port,
                str(EXAMPLE),
                *args,
            ],  # fmt: skip
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in range(nodes)
    ]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for node, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"node {node} failed:\n{out[-4000:]}"


def _keys(report: Path) -> tuple[dict, list[list[int]]]:
    rep = json.loads(report.read_text())
    return rep, [r["keys"] for r in sorted(rep["ranks"], key=lambda r: r["rank"])]


@pytest.mark.slow  # a cluster run (4 torch processes); tests/test_distributed.py runs 2 gloo ranks
def test_two_nodes_of_two_ranks_deliver_every_record_once(packed, tmp_path):
    path, sizes = packed
    torchrun(2, 2, path, "--report", str(tmp_path / "rep.json"))
    rep, per_rank = _keys(tmp_path / "rep.json")
    assert rep["world"] == 4 and rep["sampler"] == "ShardOrder"
    assert len({r["steps"] for r in rep["ranks"]}) == 1  # equal batch counts
    seen = Counter(k for keys in per_rank for k in keys)
    assert len(seen) == N  # every record, across nodes x ranks x workers
    assert sum(seen.values()) - N == ShardOrder(sizes, world_size=4).padding


@pytest.mark.slow
def test_stopped_on_four_ranks_resumed_on_three(packed, tmp_path):
    path, sizes = packed
    ckpt = str(tmp_path / "ckpt.json")
    small = ("--batch-size", "2")  # 4 batches per rank: stop after 2
    torchrun(
        2, 2, path, *small, "--checkpoint", ckpt, "--save-at", "2", "--report", str(tmp_path / "a")
    )
    state = json.loads(Path(ckpt).read_text())["loader"]
    assert (state["world_size"], state["batch"], state["epoch"]) == (4, 2, 0)
    torchrun(1, 3, path, *small, "--resume", ckpt, "--report", str(tmp_path / "b"))
    _, before = _keys(tmp_path / "a")
    rep, after = _keys(tmp_path / "b")
    assert rep["world"] == 3 and len({r["steps"] for r in rep["ranks"]}) == 1
    seen = Counter(k for keys in before + after for k in keys)
    assert len(seen) == N  # nothing lost
    assert sum(seen.values()) - N <= ShardOrder(sizes, world_size=4).padding + 2
