"""Two real torch.distributed (gloo) processes, each running a stoker.Loader with 2 workers.

Each rank reads its rank and world size from torch.distributed; per epoch the union of the keys
delivered by both ranks is exactly the dataset, with nothing repeated beyond the declared
padding; a loader resumed mid-epoch from a JSON round-tripped ``state_dict()`` delivers exactly
the rest of that epoch. The ranks also check the union among themselves with a gloo
``all_gather_object``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.timeout(120)]

WORLD = 2
N = 23  # not a multiple of the world size: one padded duplicate per epoch
BATCH = 5
SEED = 1234


def _make_dataset(root: str) -> str:
    from stoker.pack import make_sample_data, pack

    images = make_sample_data(os.path.join(root, "img"), classes=3, per_class=8, size=32, workers=1)
    # 24 images; drop one so that N is odd
    victim = sorted((images / "class_02").iterdir())[-1]
    victim.unlink()
    report = pack(images, os.path.join(root, "data"), workers=1, progress=False)
    if report.written != N:
        raise RuntimeError(f"packing the test data wrote {report.written} of {N} images: {report}")
    return os.path.join(root, "data.rec")


def _rank_main(rank: int, world: int | str, init_file: str, out_dir: str) -> None:
    import stoker
    from stoker.transforms import Resize

    world = int(world)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        if rank == 0:  # pack here: its process pool ends with this process
            _make_dataset(out_dir)
        dist.barrier()
        rec = os.path.join(out_dir, "data.rec")
        result: dict = {"rank": rank}
        kw = {"batch_size": BATCH, "workers": 2, "shuffle": True, "seed": SEED}
        with stoker.Loader(rec, transforms=Resize(32), **kw) as loader:
            result["sampler"] = loader.sampler.fingerprint()
            result["padding"] = loader.sampler.padding
            result["len"] = len(loader)
            for epoch in range(2):  # the epoch advances by itself
                result[f"epoch{epoch}"] = [k for b in loader for k in b.keys.tolist()]
            # epoch 2: stop after two batches and keep the state
            first: list[int] = []
            for number, batch in enumerate(loader):
                first += batch.keys.tolist()
                if number == 1:
                    break
            state = json.loads(json.dumps(loader.state_dict()))
        with stoker.Loader(rec, transforms=Resize(32), **kw) as resumed:
            resumed.load_state_dict(state)
            rest = [k for b in resumed for k in b.keys.tolist()]
            result["expected2"] = [resumed.source.key(int(i)) for i in resumed.sampler.indices(2)]
        result["state"] = state
        result["epoch2"] = first + rest
        gathered: list = [None] * world
        dist.all_gather_object(gathered, result["epoch2"])
        result["gathered2"] = gathered
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_see_the_dataset_exactly_once_per_epoch(tmp_path):
    # Plain interpreter processes (not multiprocessing.spawn): the forkserver and resource
    # tracker that a process pool starts then belong to the ranks and end with them.
    init_file = tmp_path / "dist_init"
    here = os.path.dirname(os.path.abspath(__file__))
    code = "import sys; from test_distributed import _rank_main; _rank_main(int(sys.argv[1]), *sys.argv[2:])"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, *sys.path]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(r), str(WORLD), str(init_file), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    try:
        outputs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {r} failed:\n{out}"
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r, res in enumerate(results):
        # rank and world size came from torch.distributed, not from arguments
        assert (res["sampler"]["rank"], res["sampler"]["world_size"]) == (r, WORLD)
        assert res["state"]["epoch"] == 2 and res["state"]["batch"] == 2
        assert res["epoch2"] == res["expected2"]  # resumed run == the planned epoch order
    padding = results[0]["padding"]
    assert padding == (-N) % WORLD == 1
    everything = set(range(N))
    for epoch in range(3):
        per_rank = [res[f"epoch{epoch}"] for res in results]
        assert len({len(p) for p in per_rank}) == 1  # equal per-rank lengths
        counts = Counter(k for p in per_rank for k in p)
        assert set(counts) == everything  # union over ranks is the dataset
        assert sum(counts.values()) - N == padding  # duplicated only by the declared padding
    assert results[0]["epoch0"] != results[0]["epoch1"]  # epochs are reshuffled
    assert results[0]["gathered2"] == [res["epoch2"] for res in results]
