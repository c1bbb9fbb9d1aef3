"""The torch edge against the real loader: as_tensors, CudaPrefetcher over stoker.Loader,
RecordDataset in a torch DataLoader with workers, distributed_info, the thread prefetcher."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch_doubles import IMAGENET_MEAN as MEAN
from torch_doubles import IMAGENET_STD as STD

import stoker
import stoker.torch as st
from stoker.pack import make_sample_data, pack
from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize


def _transforms():
    return Compose([Resize(32), RandomCrop(28), HorizontalFlip()])


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    root = tmp_path_factory.mktemp("edge")
    images = make_sample_data(root / "images", classes=3, per_class=12, size=32, workers=1)
    pack(images, root / "train", workers=1, progress=False)
    return root / "train.rec"


def _loader(rec, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("workers", 2)
    kw.setdefault("seed", 7)
    return stoker.Loader(rec, transforms=_transforms(), **kw)


def test_public_names_sorted():
    assert st.__all__ == sorted(st.__all__)
    for name in st.__all__:
        assert getattr(st, name) is not None


def test_as_tensors_shares_memory_with_the_batch(rec):
    with _loader(rec) as loader:
        seen = 0
        wrapped = st.as_tensors(loader)
        assert len(wrapped) == len(loader)
        for tb in wrapped:
            assert isinstance(tb, st.TensorBatch)
            src = tb.source
            assert tb.images.dtype == torch.uint8 and tb.images.shape[1:] == (28, 28, 3)
            # no copy: the tensor is the shared-memory view itself
            assert tb.images.data_ptr() == src.images.__array_interface__["data"][0]
            assert np.shares_memory(tb.images.numpy(), src.images)
            assert torch.equal(tb.labels, torch.from_numpy(src.labels))
            assert np.array_equal(tb.keys, src.keys)
            images, labels = tb
            assert images is tb.images and labels is tb.labels
            seen += len(tb)
        assert seen == 36


def test_as_tensors_keeps_structures_without_copy():
    a = np.arange(12, dtype=np.uint8).reshape(3, 4)
    (d,) = list(st.as_tensors([{"x": a, "name": "n", "pair": (a, 1)}]))
    assert d["name"] == "n" and d["pair"][1] == 1
    assert np.shares_memory(d["x"].numpy(), a) and np.shares_memory(d["pair"][0].numpy(), a)


def test_as_tensors_pin_memory_without_cuda_warns():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.warns(UserWarning, match="not pinned"):
        st.as_tensors([], pin_memory=True)


def test_prefetcher_over_the_real_loader_equals_reference(rec):
    with _loader(rec) as loader:
        direct = [(b.images.copy(), b.labels.copy(), b.keys.copy()) for b in loader]
    with _loader(rec) as loader:
        pf = st.CudaPrefetcher(loader, device="cpu", mean=MEAN, std=STD, dtype=torch.bfloat16)
        assert len(pf) == len(direct)
        got = list(pf)
    assert len(got) == len(direct) == 5
    m = torch.tensor([v * 255 for v in MEAN]).view(1, 3, 1, 1)
    s = torch.tensor([v * 255 for v in STD]).view(1, 3, 1, 1)
    for out, (images, labels, keys) in zip(got, direct):
        ref = ((torch.from_numpy(images).permute(0, 3, 1, 2).float() - m) / s).to(torch.bfloat16)
        assert torch.equal(out.images, ref)
        assert torch.equal(out.labels, torch.from_numpy(labels))
        assert np.array_equal(out.keys, keys)


def test_prefetcher_over_as_tensors_and_break_leaves_nothing(rec):
    with _loader(rec) as loader:
        for _epoch in range(3):
            for i, batch in enumerate(st.CudaPrefetcher(st.as_tensors(loader), device="cpu")):
                assert batch.images.shape[1:] == (3, 28, 28)
                if i == 1:
                    break
        # the slots came back: a full epoch still runs
        assert sum(len(b) for b in loader) > 0
        assert sum(len(b) for b in loader) == 36


def test_prefetcher_depth_beyond_the_loader_slots_is_refused(rec):
    with _loader(rec, prefetch=1) as loader:
        with pytest.raises(ValueError, match=f"prefetch=1: {loader.slots} slots"):
            st.CudaPrefetcher(loader, device="cpu", depth=loader.slots)
        st.CudaPrefetcher(loader, device="cpu", depth=loader.slots - 1)


def test_record_dataset_in_a_torch_dataloader_with_two_workers(rec):
    ds = st.RecordDataset(rec, transforms=_transforms(), seed=7)
    assert len(ds) == 36 and ds.class_names == ["class_00", "class_01", "class_02"]
    ds[0]  # the files are open in this process now
    sent = pickle.dumps(ds)
    assert len(sent) < 4000  # the reader travels as its configuration, no labels or handles
    clone = pickle.loads(sent)  # noqa: S301 - our own object, made just above
    assert clone._reader.shard_sizes().sum() == len(clone) == 36  # reopened where it is used
    assert torch.equal(clone[5][0], ds[5][0]) and clone[5][1] == ds[5][1]
    clone.close()
    dl = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2)
    images = torch.cat([x for x, _ in dl])
    labels = torch.cat([y for _, y in dl])
    assert images.shape == (36, 28, 28, 3) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64
    # the same samples, augmentation and labels as stoker's own loader with the same seed
    with _loader(rec) as loader:
        ref_images = np.concatenate([b.images.copy() for b in loader])
    with _loader(rec) as loader:
        ref_labels = np.concatenate([b.labels.copy() for b in loader])
    assert np.array_equal(images.numpy(), ref_images)
    assert np.array_equal(labels.numpy(), ref_labels)
    # set_epoch changes the augmentation
    ds.set_epoch(1)
    assert not torch.equal(torch.stack([ds[i][0] for i in range(36)]), images)
    ds.close()


def test_record_dataset_bad_index_and_path(rec, tmp_path):
    ds = st.RecordDataset(rec)
    assert torch.equal(ds[-1][0], ds[35][0])
    with pytest.raises(IndexError, match="out of range for 36 records"):
        ds[36]
    with pytest.raises(TypeError, match="index must be an int"):
        ds["0"]  # type: ignore[index]
    ds.close()
    with pytest.raises((FileNotFoundError, stoker.StokerError)):
        st.RecordDataset(tmp_path / "missing.rec")


def test_distributed_info_without_a_process_group():
    assert st.distributed_info() == (0, 1)


def test_distributed_info_with_a_gloo_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1
    )
    try:
        assert st.distributed_info() == (0, 1)
        assert dist.is_initialized()
    finally:
        dist.destroy_process_group()
    assert st.distributed_info() == (0, 1)


def _gpu_check_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_script_runs_its_cpu_path(capsys):
    """scripts/gpu_check.py stays runnable: checks (a) and (b) through the CPU path."""
    mod = _gpu_check_module()
    threads = torch.get_num_threads()
    try:
        assert mod.main(["--device", "cpu", "--batches", "12", "--skip-timing"]) == 0
    finally:
        torch.set_num_threads(threads)  # the script's CPU run sets 1
    out = capsys.readouterr().out
    assert "(a) depth 2, pinned slots" in out and "total" in out and "PASS" in out


def test_gpu_check_script_fails_when_its_control_or_pool_bound_does_not_hold(monkeypatch, capsys):
    """The control must fail the run when a broken protocol goes unnoticed, and the pool check
    must fail when the pools are not trimmed."""
    from torch_doubles import FakeBackend

    from stoker.torch._staging import StagingPools

    mod = _gpu_check_module()
    threads = torch.get_num_threads()
    monkeypatch.setattr(mod, "BrokenFakeBackend", lambda: FakeBackend(lag=3, hold_events=True))
    try:
        assert mod.main(["--device", "cpu", "--batches", "12", "--skip-timing"]) == 1
    finally:
        torch.set_num_threads(threads)
    assert "NOT caught" in capsys.readouterr().out
    assert mod.check_pools_bounded(torch.device("cpu")) == 0
    monkeypatch.setattr(StagingPools, "_trim", lambda self, keep: None)
    assert mod.check_pools_bounded(torch.device("cpu")) == 1


@pytest.mark.gpu
def test_gpu_check_quick():
    """On a CUDA machine: the checks of scripts/gpu_check.py, small."""
    mod = _gpu_check_module()
    dev = torch.device("cuda")
    assert mod.check_bit_exact(dev, batches=100, sleep_cycles=2_000_000) == 0
    assert mod.check_memory_flat(dev, epochs=3, batches=20) == 0


def test_the_loader_keeps_the_linux_engine_while_cuda_is_not_initialised(rec):
    """torch imported is not CUDA initialised: the default engine stays the fork server."""
    assert not torch.cuda.is_initialized()
    with _loader(rec, workers=1) as ld:
        assert (ld.engine, ld.start_method) == ("linux", "forkserver")


_CUDA_FIRST = """
import sys
import torch
import stoker

if __name__ == "__main__":
    torch.cuda.init()
    with stoker.Loader(sys.argv[1], batch_size=8, workers=2, seed=7, transforms=None) as ld:
        n = sum(len(b) for b in ld)
    print(ld.engine, ld.start_method, n)
"""


@pytest.mark.gpu
def test_a_loader_made_after_cuda_init_takes_the_portable_engine(rec):
    """Forking a process that initialised CUDA is unsafe: the default engine is then spawn."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _CUDA_FIRST, str(rec)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out == ["portable", "spawn", "36"]
