"""Batch mixing in the loader (``Loader(mix=...)``): the worker that fills a chunk mixes its
pairs of rows, so the batches are the same for any worker count and either layout, and a
mixed pair is the blend of the rows the unmixed loader delivers."""

from __future__ import annotations

import numpy as np
import pytest

from stoker._core.errors import SpecError
from stoker.loader import Loader
from stoker.transforms import HorizontalFlip, MixUp, MixUpCutMix, RandAugment


def _run(arrays, workers, mix, layout="NHWC", transforms=None):
    # batches of 14 in 3 workers' chunks: 6, 6 and 2 rows
    opts = {"transforms": transforms or RandAugment(), "shuffle": True, "seed": 4}
    with Loader(arrays, batch_size=14, mix=mix, workers=workers, layout=layout, **opts) as ld:
        return [(b.images.copy(), b.labels.copy(), b.indices.copy()) for b in ld]


def test_mixed_batches_are_the_same_for_any_worker_count_and_layout(arrays):
    mix = MixUpCutMix(num_classes=5)
    here, three, chw = _run(arrays, 0, mix), _run(arrays, 3, mix), _run(arrays, 2, mix, "NCHW")
    assert [len(b[0]) for b in here] == [14, 14, 14, 14, 4]
    for (img, lab, idx), (img3, lab3, idx3), (imgc, labc, _) in zip(here, three, chw):
        np.testing.assert_array_equal(idx, idx3)
        np.testing.assert_array_equal(img, img3)
        np.testing.assert_array_equal(lab, lab3)
        np.testing.assert_array_equal(img, imgc.transpose(0, 2, 3, 1))
        np.testing.assert_array_equal(lab, labc)
        assert lab.dtype == np.float32 and lab.shape == (len(idx), 5)
        np.testing.assert_allclose(lab.sum(axis=1), 1.0, rtol=1e-6)


def test_a_mixed_pair_is_the_blend_of_its_rows(arrays):
    x, y = arrays
    plain = _run(arrays, 0, None, transforms=HorizontalFlip())
    mixed = _run(arrays, 2, MixUp(1.0, num_classes=5), transforms=HorizontalFlip())
    for (img, _, idx), (mimg, mlab, midx) in zip(plain, mixed):
        np.testing.assert_array_equal(idx, midx)
        for i in range(0, len(idx) - 1, 2):
            a, b = y[idx[i]], y[idx[i + 1]]
            if a == b:
                continue
            lam = mlab[i, a]  # no label smoothing: the weight of the row's own class
            blend = lam * img[i].astype(float) + (1 - lam) * img[i + 1]
            assert np.abs(mimg[i] - blend).max() <= 1.0
            assert mlab[i + 1, b] == pytest.approx(lam, abs=1e-6)


def test_mixing_refuses_pairs_and_labels_it_cannot_mix(arrays):
    x, y = arrays
    with pytest.raises(SpecError, match="pair_with"):
        Loader(
            arrays, batch_size=4, pair_with=HorizontalFlip(), mix=MixUp(num_classes=5), workers=0
        )
    with pytest.raises(SpecError, match="integer class labels"):
        Loader((x, y.astype(np.float32)), batch_size=4, mix=MixUp(num_classes=5), workers=0)
