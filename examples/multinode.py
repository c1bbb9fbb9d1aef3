"""Training across nodes with torchrun: each rank reads its own part of a packed set.

Every rank builds a ``stoker.Loader`` whose rank and world size come from torch.distributed, so
across nodes x ranks x workers each sample is delivered once per epoch (up to the declared
padding). A set of several shards is read in shard order (``shuffle="shards"``: each rank
reads whole shards of its own), a single shard with a global shuffle. The loader's position
is saved as JSON at a step and a later run resumes from it, also on another number of ranks
(elastic resume: the rest of the epoch is split across the new ranks).

Two nodes, two processes each (on one machine: two shells, ``--master-addr 127.0.0.1``):

    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 0 --master-addr HOST --master-port 29500 \\
        examples/multinode.py DATA.stoker.json --checkpoint ckpt.json --save-at 3
    torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 --master-addr HOST --master-port 29500 \\
        examples/multinode.py DATA.stoker.json --checkpoint ckpt.json --save-at 3

Resume, e.g. on three processes of one node:
``torchrun --nproc-per-node 3 examples/multinode.py DATA.stoker.json --resume ckpt.json``.
DATA may be a URL (``s3://bucket/train.stoker.json``) where remote reading is installed.
``--report FILE``: rank 0 writes every rank's delivered keys and batch counts (all_gather).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import stoker
from stoker.transforms import Resize


def write_json(path: str, obj: object) -> None:
    """Atomically: a temporary file, fsync, rename."""
    tmp = f"{path}.partial"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def make_loader(args: argparse.Namespace) -> stoker.Loader:
    kw = dict(batch_size=args.batch_size, transforms=Resize(args.size), seed=args.seed)
    try:  # whole shards per rank when there are at least as many shards as ranks
        return stoker.Loader(args.data, shuffle="shards", workers=args.workers, **kw)
    except ValueError as e:
        if dist.get_rank() == 0:
            print(f"shard order not possible ({e}); using shuffle=True", flush=True)
        return stoker.Loader(args.data, shuffle=True, workers=args.workers, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="a packed set: NAME.stoker.json, a .rec, or a URL")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--size", type=int, default=16, help="images are resized to SIZE x SIZE")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint", help="where to save the loader state and the model")
    ap.add_argument("--save-at", type=int, help="save after this many steps, then stop")
    ap.add_argument("--resume", help="a checkpoint written by --checkpoint")
    ap.add_argument("--report", help="rank 0 writes every rank's keys and batch counts here")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    torch.manual_seed(args.seed)
    net = nn.Sequential(nn.Flatten(), nn.Linear(args.size * args.size * 3, args.classes))
    model = nn.parallel.DistributedDataParallel(net.to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    keys: list[int] = []
    steps = 0
    with make_loader(args) as loader:
        if args.resume:
            with open(args.resume) as f:
                ckpt = json.load(f)
            loader.load_state_dict(ckpt["loader"])  # any number of ranks
            net.load_state_dict(torch.load(args.resume + ".pt", weights_only=True))
        first = loader.epoch
        for _ in range(first, args.epochs):
            for batch in loader:
                x = torch.from_numpy(batch.images).to(device).float().div(255)
                y = torch.as_tensor(batch.labels, dtype=torch.int64, device=device)
                loss = nn.functional.cross_entropy(model(x), y.reshape(-1) % args.classes)
                opt.zero_grad()
                loss.backward()
                opt.step()
                keys += batch.keys.tolist()
                steps += 1
                if args.save_at is not None and steps == args.save_at:
                    break
            if args.save_at is not None and steps == args.save_at:
                break
        state = loader.state_dict()  # every rank is at the same batch: rank 0's is enough
        sampler = loader.sampler.fingerprint()["type"]
    if args.checkpoint and args.save_at is not None and rank == 0:
        torch.save(net.state_dict(), args.checkpoint + ".pt")
        write_json(args.checkpoint, {"loader": state, "steps": steps})
    every: list[Any] = [None] * world
    dist.all_gather_object(every, {"rank": rank, "keys": keys, "steps": steps})
    if rank == 0:
        print(f"{world} ranks, {sampler}: steps per rank {[e['steps'] for e in every]}")
        if args.report:
            write_json(args.report, {"world": world, "sampler": sampler, "ranks": every})
    dist.barrier()  # every rank done with the group before any tears it down
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
