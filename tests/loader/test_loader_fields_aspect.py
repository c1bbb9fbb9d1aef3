"""Variable-size images through the loader: aspect-ratio buckets, each batch padded to its
largest sample (bottom and right, zeros), the stored sizes carried as ``size``."""

from __future__ import annotations

import numpy as np
import pytest
from fields_source import FieldsSource, all_batches, assert_same

import stoker
from stoker.codecs import decode
from stoker.sampling import AspectBuckets
from stoker.transforms import Compose, HorizontalFlip, Resize

SIZES = [(48, 64), (64, 48), (40, 40), (36, 48), (66, 50), (42, 56)]


@pytest.fixture(scope="module")
def src() -> FieldsSource:
    return FieldsSource(26, sizes=SIZES)


def _sampler(src, **kw) -> AspectBuckets:
    return AspectBuckets(src.image_sizes(), batch_size=4, ratio_bounds=[0.9, 1.1, 2.0], **kw)


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_padded_to_their_largest_image(src, workers):
    with stoker.Loader(src, batch_size=4, sampler=_sampler(src, seed=1), workers=workers) as ld:
        assert ld.output_spec.shape == (None, None, 3)
        n = 0
        for b in ld:
            sizes = np.asarray([src.sizes[i] for i in b.indices])
            np.testing.assert_array_equal(b["size"], sizes)
            assert b.images.shape == (len(b), *sizes.max(axis=0), 3)
            assert b.fields["mask"].shape == (len(b), *sizes.max(axis=0))
            for r, i in enumerate(b.indices.tolist()):
                h, w = src.sizes[i]
                t = src.samples[i]
                np.testing.assert_array_equal(b.images[r, :h, :w], decode(t["jpeg"]))
                assert not b.images[r, h:].any() and not b.images[r, :, w:].any()
                np.testing.assert_array_equal(b["mask"][r][:h, :w], t["mask_array"])
                assert not b["mask"][r][h:].any() and not b["mask"][r][:, w:].any()
                np.testing.assert_array_equal(b["boxes"][r], t["boxes"])  # padding moves nothing
            n += len(b)
        assert n >= len(src)


def test_workers_and_resume_give_the_same_batches(src):
    chain = Compose([Resize(24, shorter_side=True), HorizontalFlip()])
    kw = dict(batch_size=4, transforms=chain, seed=2)
    with stoker.Loader(src, sampler=_sampler(src, seed=4), workers=0, **kw) as ld:
        full = all_batches(ld)
    with stoker.Loader(src, sampler=_sampler(src, seed=4), workers=2, **kw) as ld:
        assert_same(full, all_batches(ld))
        ld.set_epoch(0)
        it = iter(ld)
        next(it)
        next(it)
        state = ld.state_dict()
    with stoker.Loader(src, sampler=_sampler(src, seed=4), workers=2, **kw) as ld:
        ld.load_state_dict(state)
        assert_same(full[2:], all_batches(ld))


def test_the_frame_is_the_largest_the_transforms_make(src):
    """Resize(shorter side) turns 64x48 into 32x24 and 48x64 into 24x32: a batch holding both
    is 32x32, each image padded at the bottom or the right."""
    chain = Resize(24, shorter_side=True)
    with stoker.Loader(src, batch_size=4, transforms=chain, sampler=_sampler(src), workers=0) as ld:
        for b in ld:
            outs = [ld.pipeline.output_hw(src.sizes[i]) for i in b.indices]
            assert b.images.shape[1:3] == tuple(np.max(outs, axis=0))
            for r, (h, w) in enumerate(outs):
                assert not b.images[r, h:].any() and not b.images[r, :, w:].any()
                assert b["mask"][r][:h, :w].shape == (h, w)


def test_a_sampler_of_another_batch_size_is_refused(src):
    with stoker.Loader(src, batch_size=6, sampler=_sampler(src), workers=0) as ld:
        with pytest.raises(ValueError, match="batches of 4"):
            next(iter(ld))
