"""``stoker.watch`` per rank: each pass's figures carry the rank and world size of the
training job, the report line names the rank, and with ``gather=True`` rank 0 prints every
rank's data wait over a real gloo process group."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time

import pytest

from stoker.doctor.watch import WatchStats, format_ranks, watch


def test_figures_and_report_carry_the_rank_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    out = io.StringIO()
    watched = watch(range(4), file=out)
    assert list(watched) == [0, 1, 2, 3]
    stats = watched.epochs[-1]
    assert (stats.rank, stats.world_size) == (3, 4)
    assert stats.to_dict()["rank"] == 3 and stats.to_dict()["world_size"] == 4
    assert out.getvalue().startswith("stoker.watch: rank 3/4 epoch 0: 4 steps")


def test_one_rank_reports_as_before(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = io.StringIO()
    watched = watch(range(2), file=out)
    list(watched)
    assert out.getvalue().startswith("stoker.watch: epoch 0: 2 steps")
    assert watched.gather() == [watched.epochs[-1]]  # no process group: its own figures


def test_gather_before_any_pass_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no pass yet"):
        watch(range(2)).gather()


def _stats(rank: int, wait: float) -> WatchStats:
    return WatchStats(
        epoch=1,
        steps=10,
        wait_s=wait,
        work_s=1.0,
        elapsed_s=1.0 + wait,
        first_wait_s=0.0,
        wait_p50_s=wait / 10,
        wait_p99_s=wait / 10,
        wait_max_s=wait / 10,
        stalls=0,
        rank=rank,
        world_size=3,
    )


def test_the_rank_table_names_the_rank_that_waited_most():
    text = format_ranks([_stats(0, 0.1), _stats(1, 2.0), _stats(2, 0.3)])
    lines = text.splitlines()
    assert lines[0] == "epoch 1, data wait per rank:"
    assert [line.split(":")[0].strip() for line in lines[1:4]] == ["rank 0", "rank 1", "rank 2"]
    assert lines[-1] == "  most waiting: rank 1 (66.7 %)"


_RANK = """
import sys, time
import torch.distributed as dist
from stoker.doctor.watch import watch

rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=world)

def slow(n, pause):
    for i in range(n):
        time.sleep(pause)  # the data pipeline is late: this is data wait
        yield i

try:
    watched = watch(slow(5, 0.05 if rank == 1 else 0.0), gather=True, file=sys.stdout)
    assert list(watched) == list(range(5))
    every = watched.gather()
    assert [s.rank for s in every] == list(range(world))
    assert every[1].wait_s > every[0].wait_s
finally:
    dist.destroy_process_group()
"""


@pytest.mark.dist
@pytest.mark.timeout(60)
def test_gather_prints_every_ranks_wait_on_rank_zero(tmp_path):
    pytest.importorskip("torch")
    init = tmp_path / "init"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(r), "2", str(init)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=dict(os.environ, PYTHONWARNINGS="ignore"),
        )
        for r in range(2)
    ]
    start = time.monotonic()
    try:
        outs = [p.communicate(timeout=50)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r}:\n{out}"
    assert "rank 0/2 epoch 0: 5 steps" in outs[0]
    assert "rank 1/2 epoch 0: 5 steps" in outs[1]
    assert "data wait per rank:" in outs[0] and "data wait per rank:" not in outs[1]
    assert "most waiting: rank 1" in outs[0]
    assert time.monotonic() - start < 50
