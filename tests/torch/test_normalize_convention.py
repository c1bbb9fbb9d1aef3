"""One convention for normalisation: ``transforms.Normalize`` on the CPU and
``CudaPrefetcher``/``convert_images`` on the device take ``mean``/``std`` in the same 0-1 units
(torchvision's constants as they are) and give the same numbers; statistics in pixel units
are refused with a message that says so, in both places."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_doubles import IMAGENET_MEAN as MEAN
from torch_doubles import IMAGENET_STD as STD

import stoker
import stoker.torch as st
from stoker.transforms import Compose, Normalize, RandomCrop


def test_normalize_and_the_prefetcher_give_the_same_numbers():
    x = np.random.default_rng(0).integers(0, 256, (4, 9, 7, 3), dtype=np.uint8)
    cpu = np.stack([Normalize(MEAN, STD)(img, np.random.default_rng(0)) for img in x])
    (dev,) = list(st.CudaPrefetcher([x], device="cpu", mean=MEAN, std=STD))
    np.testing.assert_allclose(dev.numpy(), cpu.transpose(0, 3, 1, 2), rtol=0, atol=2e-5)
    ref = st.convert_images(torch.from_numpy(x), mean=MEAN, std=STD)
    assert torch.equal(ref, dev)


def test_moving_normalisation_from_the_cpu_to_the_device_changes_nothing(tmp_path):
    x = np.random.default_rng(1).integers(0, 256, (16, 12, 12, 3), dtype=np.uint8)
    kw = dict(batch_size=8, seed=3, workers=0, shuffle=True)
    head = [RandomCrop(10)]
    with stoker.Loader(
        (x, np.zeros(16)), transforms=Compose([*head, Normalize(MEAN, STD)]), **kw
    ) as ld:
        on_cpu = [b.images.copy() for b in ld]
    with stoker.Loader((x, np.zeros(16)), transforms=Compose(head), **kw) as ld:
        on_dev = [b.images.numpy() for b in st.CudaPrefetcher(ld, device="cpu", mean=MEAN, std=STD)]
    for a, b in zip(on_cpu, on_dev):
        np.testing.assert_allclose(b, a.transpose(0, 3, 1, 2), rtol=0, atol=2e-5)
    assert abs(float(np.mean(on_dev[0])) - float(np.mean(on_cpu[0]))) < 1e-5


@pytest.mark.parametrize("mean,std", [((127.5,) * 3, (127.5,) * 3), (MEAN, (58.4, 57.1, 57.4))])
def test_pixel_units_are_refused_in_both_places(mean, std):
    with pytest.raises(ValueError, match="look like pixel units"):
        st.CudaPrefetcher([], device="cpu", mean=mean, std=std)
    with pytest.raises(ValueError, match="look like pixel units"):
        Normalize(mean, std)


def test_scale_one_takes_statistics_in_the_images_own_units():
    x = np.random.default_rng(2).integers(0, 256, (2, 5, 5, 3), dtype=np.uint8)
    px_mean, px_std = tuple(v * 255 for v in MEAN), tuple(v * 255 for v in STD)
    (a,) = list(st.CudaPrefetcher([x], device="cpu", mean=px_mean, std=px_std, scale=1))
    (b,) = list(st.CudaPrefetcher([x], device="cpu", mean=MEAN, std=STD))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    cpu = Normalize(px_mean, px_std, scale=1)(x[0], np.random.default_rng(0))
    np.testing.assert_allclose(cpu.transpose(2, 0, 1), b[0].numpy(), rtol=0, atol=2e-5)


def test_float_images_are_taken_in_their_own_units_by_default():
    x = torch.rand(2, 4, 4, 3)  # already 0-1
    (out,) = list(st.CudaPrefetcher([x], device="cpu", mean=0.5, std=0.25))
    want = ((x.permute(0, 3, 1, 2) - 0.5) / 0.25).contiguous()
    torch.testing.assert_close(out, want)
