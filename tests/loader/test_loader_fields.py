"""Fields from the source to the batch: every kind arrives as stored (or moved with the image,
for boxes, points and masks), the same with and without workers, after a resume, and with a
corrupt sample skipped together with its fields."""

from __future__ import annotations

import numpy as np
import pytest
from fields_source import BRIGHT, MAX_BOXES, FieldsSource, all_batches, assert_same, schema

import stoker
from stoker._core.errors import SpecError
from stoker.codecs import decode
from stoker.transforms import Compose, HorizontalFlip, RandomCrop, Resize, as_transform
from stoker.transforms.targets import MIN_VISIBILITY


@pytest.fixture(scope="module")
def src() -> FieldsSource:
    return FieldsSource(22)


@pytest.mark.parametrize("workers", [0, 2])
def test_every_kind_arrives_as_stored(src, workers):
    with stoker.Loader(src, batch_size=4, workers=workers, shuffle=True, seed=3) as loader:
        assert loader.schema is not None and list(loader.schema.extra) == [
            "boxes",
            "classes",
            "centres",
            "mask",
            "caption",
            "blob",
            "score",
        ]
        seen = 0
        for b in loader:
            assert b.schema == loader.schema and "boxes" in b and "image" in b
            images, labels = b  # the classification unpacking still works
            for r, i in enumerate(b.indices.tolist()):
                t = src.samples[i]
                np.testing.assert_array_equal(images[r], decode(t["jpeg"]))
                assert labels[r] == t["label"] and b.keys[r] == 100 + i
                np.testing.assert_array_equal(b["boxes"][r], t["boxes"])
                np.testing.assert_array_equal(b["classes"][r], t["classes"])
                np.testing.assert_array_equal(b["centres"][r], t["centres"])
                np.testing.assert_array_equal(b["mask"][r], t["mask_array"])
                assert b["caption"][r] == t["caption"]
                assert b["blob"][r] == t["blob"]
                np.testing.assert_array_equal(b["score"][r], t["score"])
                # zeros past each length, so a batch's bytes do not depend on the slot's past
                values, lengths = b.padded("boxes")
                assert not values[r, lengths[r] :].any()
                assert not b.fields["caption"][r, b.lengths["caption"][r] :].any()
            assert b.fields["boxes"].shape == (len(b), MAX_BOXES, 4)
            assert b.fields["boxes"].dtype == np.float32 and b.lengths["boxes"].dtype == np.int32
            assert b.fields["mask"].shape == (len(b), 48, 64)
            seen += len(b)
        assert seen == len(src)


def test_workers_0_and_2_give_the_same_bytes(src):
    t = Compose([RandomCrop(40), HorizontalFlip()])
    runs = []
    for workers in (0, 2):
        with stoker.Loader(
            src, batch_size=5, transforms=t, workers=workers, seed=9, shuffle=True
        ) as ld:
            runs.append(all_batches(ld))
    assert_same(runs[0], runs[1])


def test_resume_mid_epoch_gives_the_remaining_batches_with_their_fields(src):
    t = Compose([RandomCrop(40), HorizontalFlip()])
    kw = dict(batch_size=4, transforms=t, seed=5, shuffle=True)
    with stoker.Loader(src, workers=2, **kw) as ld:
        full = all_batches(ld)
    with stoker.Loader(src, workers=2, **kw) as ld:
        it = iter(ld)
        next(it)
        next(it)
        state = ld.state_dict()
    with stoker.Loader(src, workers=0, **kw) as ld:
        ld.load_state_dict(state)
        rest = all_batches(ld)
    assert_same(full[2:], rest)


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_drops_a_corrupt_sample_with_its_fields(workers):
    bad = FieldsSource(12, bad=(5,))
    with stoker.Loader(
        bad, batch_size=4, workers=workers, on_error="skip", max_bad_fraction=0.5, seed=0
    ) as ld:
        batches = list(ld)
        got = []
        for b in batches:
            assert len(b["caption"]) == len(b) == len(b.fields["mask"]) == len(b.lengths["boxes"])
            for r, i in enumerate(b.indices.tolist()):
                t = bad.samples[i]
                assert b["caption"][r] == t["caption"]
                np.testing.assert_array_equal(b["boxes"][r], t["boxes"])
                np.testing.assert_array_equal(b["mask"][r], t["mask_array"])
            got.extend(b.indices.tolist())
        assert 5 not in got and len(got) == 11
        assert [r["key"] for r in ld.rejects] == [105]


def _bright(img: np.ndarray) -> np.ndarray:
    """Where the drawn rectangles are in an image."""
    return img.min(axis=2) > (BRIGHT + 60) // 2


GEOMETRY_CASES = [
    ((48, 64), Compose([Resize((72, 96)), RandomCrop((56, 80)), HorizontalFlip()])),
    # a JPEG four times the output size is decoded at a reduced DCT scale: the targets, in
    # stored pixels, are rescaled to the decoded image before the chain runs
    ((192, 256), Compose([Resize((48, 64)), HorizontalFlip()])),
]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", range(len(GEOMETRY_CASES)))
def test_geometry_follows_the_image(workers, case):
    hw, chain = GEOMETRY_CASES[case]
    src = FieldsSource(16, hw=hw)
    size = chain.transforms[0].size  # the Resize: output pixels per stored pixel
    scale = size[0] * size[1] / (hw[0] * hw[1])
    with stoker.Loader(src, batch_size=4, transforms=chain, workers=workers, seed=1) as ld:
        checked = 0
        for b in ld:
            for r in range(len(b)):
                bright = _bright(b.images[r])
                mask = b["mask"][r]
                # the mask covers the drawn rectangles (nearest-neighbour vs bilinear edges)
                agree = np.mean((mask > 0) == bright)
                assert agree > 0.97, agree
                for box, cls, centre in zip(b["boxes"][r], b["classes"][r], b["centres"][r]):
                    x1, y1, x2, y2 = box
                    inside = mask[int(np.ceil(y1)) : int(y2), int(np.ceil(x1)) : int(x2)]
                    assert inside.size and np.all(inside == cls)  # box and class on its object
                    if centre[2]:  # a visible centre lies in its (clipped) box
                        assert x1 <= centre[0] <= x2 and y1 <= centre[1] <= y2
                    else:  # the crop cut it off
                        h, w = mask.shape
                        assert not (0 <= centre[0] < w and 0 <= centre[1] < h)
                    checked += 1
                # every object left in the mask kept its box, unless the crop left less of it
                # than a box needs to be kept (MIN_VISIBILITY of its area)
                kept = set(b["classes"][r].tolist())
                stored = src.samples[int(b.indices[r])]["mask_array"]
                for cls in set(np.unique(mask[mask > 0]).tolist()) - kept:
                    left = np.count_nonzero(mask == cls) / scale
                    assert left < (MIN_VISIBILITY + 0.05) * np.count_nonzero(stored == cls), cls
        assert checked > 5


def test_images_with_fields_equal_the_classification_path():
    """The targets path draws from the same rng in the same order: the same pixels."""
    src = FieldsSource(10)
    chain = Compose([RandomCrop(40), HorizontalFlip()])
    runs = []
    for fields in (None, []):
        with stoker.Loader(
            src, batch_size=5, transforms=chain, workers=0, seed=4, fields=fields
        ) as ld:
            runs.append([b.images.copy() for b in ld])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_a_mask_over_255_is_refused_naming_key_and_field():
    import cv2

    src = FieldsSource(4)
    big = np.full((48, 64), 300, np.uint16)
    src.samples[2] = dict(src.samples[2], mask=cv2.imencode(".png", big)[1].tobytes())
    with stoker.Loader(src, batch_size=2, workers=0, fields=["mask"]) as ld:
        with pytest.raises(SpecError, match=r"key 102 .*'mask'.*300"):
            list(ld)


def test_classification_batches_carry_no_fields(folder):
    with stoker.Loader(folder, batch_size=8, transforms=Resize((32, 32)), workers=0) as ld:
        assert ld.schema is None
        b = next(iter(ld))
        assert b.fields == {} and b.lengths == {} and b.schema is None


def test_a_classification_loader_never_reads_fields():
    class NoFields(FieldsSource):
        def reader(self, indices=None, fields=()):
            if fields:
                raise AssertionError("the classification path read fields")
            return super().reader(indices, fields)

    src = NoFields(6)
    with stoker.Loader(src, batch_size=3, workers=0, fields=[]) as ld:
        b = next(iter(ld))
        assert b.fields == {} and b.schema is None


def test_fields_select_some_and_size(src):
    with stoker.Loader(src, batch_size=4, workers=0, fields=["caption", "size"]) as ld:
        b = next(iter(ld))
        assert list(b.fields) == ["caption", "size"]
        assert b["size"].dtype == np.int32 and b["size"].tolist() == [[48, 64]] * 4


def test_unknown_field_is_refused(src):
    with pytest.raises(SpecError, match="unknown fields"):
        stoker.Loader(src, batch_size=4, workers=0, fields=["nope"])


def test_pair_with_refuses_fields(src):
    with pytest.raises(SpecError, match="pair_with"):
        stoker.Loader(src, batch_size=4, workers=0, pair_with=HorizontalFlip())
    stoker.Loader(src, batch_size=4, workers=0, pair_with=HorizontalFlip(), fields=[]).close()


def test_a_step_that_cannot_move_geometry_is_refused_before_data_flows(src):
    plain = as_transform(lambda img: img[::-1].copy(), output="same")
    with pytest.raises(SpecError, match="cannot carry"):
        stoker.Loader(src, batch_size=4, workers=0, transforms=Compose([RandomCrop(40), plain]))
    # without geometric fields the same chain is fine
    stoker.Loader(src, batch_size=4, workers=0, transforms=plain, fields=["caption"]).close()


def test_a_field_without_max_len_is_refused():
    src = FieldsSource(4, schema_=schema(max_len=False))
    with pytest.raises(SpecError, match="'boxes'.*max_len"):
        stoker.Loader(src, batch_size=2, workers=0)


def test_a_sample_over_max_len_names_key_and_field():
    s = schema()
    tight = s.with_max_len({"caption": 8})
    src = FieldsSource(4, schema_=tight)
    with stoker.Loader(src, batch_size=2, workers=0, fields=["caption"]) as ld:
        with pytest.raises(SpecError, match=r"key 10\d .*'caption'.*max_len 8"):
            list(ld)


def test_a_retained_batch_keeps_its_fields(src):
    with stoker.Loader(src, batch_size=4, workers=2, seed=2, prefetch=1) as ld:
        kept = []
        for b in ld:
            kept.append((b.retain(), b["caption"], b.fields["mask"].copy()))
            if len(kept) == 2:
                break
        for b, captions, masks in kept:
            assert b["caption"] == captions == [src.samples[i]["caption"] for i in b.indices]
            np.testing.assert_array_equal(b.fields["mask"], masks)
            b.release()


def test_thread_prefetch_hands_fields_over(src):
    with stoker.Loader(src, batch_size=4, workers=2, seed=2) as ld:
        direct = all_batches(ld)
        ld.set_epoch(0)
        through = all_batches(stoker.prefetch(ld, 2))
    assert_same(direct, through)
