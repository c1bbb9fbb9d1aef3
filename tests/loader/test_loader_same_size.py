"""A set whose images all share one size needs no transforms (issue 20, item 3): an insightface
(MS1M layout) ``.rec``, a packed folder and the folder itself load with ``Loader(src,
batch_size=...)`` alone; a set of mixed sizes is still refused, and an image of another size
that the first look missed is an error naming its key and both sizes, or skipped under
``on_error="skip"``."""

from __future__ import annotations

import io
import os
import shutil

import numpy as np
import pytest
from PIL import Image

import stoker
from stoker import SpecError, WorkerError
from stoker.codecs import decode
from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.pipeline import DecodeOptions
from stoker.transforms import Compose, HorizontalFlip, Normalize, Resize

pytestmark = pytest.mark.timeout(120)


def jpeg(seed: int, hw: tuple[int, int]) -> bytes:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def folder(root, n: int, hw: tuple[int, int], odd: dict[int, tuple[int, int]] | None = None):
    """``n`` JPEGs of size ``hw`` in two class folders, in walk order ``class_0/00``,
    ``class_0/01``, ...; position ``i`` in ``odd`` has that size instead. Returns their bytes."""
    out = []
    for i in range(n):
        cls = f"class_{i * 2 // n}"
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        data = jpeg(i, (odd or {}).get(i, hw))
        with open(os.path.join(root, cls, f"{i:02d}.jpg"), "wb") as f:
            f.write(data)
        out.append(data)
    return out


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    """An MS1M-layout ``.rec`` of 112x112 faces as insightface's face2rec writes it: header
    record 0, images 1..a-1 labelled by identity, identity records after them."""
    rec = tmp_path_factory.mktemp("ms1m") / "train.rec"
    per_identity = (3, 2, 4)
    idents = [j for j, n in enumerate(per_identity) for _ in range(n)]
    a = 1 + len(idents)
    jpegs = [jpeg(k, (112, 112)) for k in range(1, a)]
    with RecordWriter(rec) as w:
        for k, ident in enumerate(idents, start=1):
            w.write(k, pack_header(IRHeader(0, float(ident), k, 0), jpegs[k - 1]))
        start = 1
        for j, n in enumerate(per_identity):
            w.write(a + j, pack_header(IRHeader(0, [start, start + n], 0, 0), b""))
            start += n
        w.write(0, pack_header(IRHeader(0, [a, a + len(per_identity)], 0, 0), b""))
    return str(rec), jpegs, idents


@pytest.mark.parametrize("workers", [0, 2])
def test_an_insightface_rec_loads_without_transforms(faces, workers):
    rec, jpegs, idents = faces
    with stoker.Loader(rec, batch_size=4, workers=workers, seed=0) as loader:
        assert loader.output_spec.shape == (112, 112, 3)
        batches = [(b.images.copy(), b.labels.copy(), b.keys.copy()) for b in loader]
    images = np.concatenate([b[0] for b in batches])
    assert images.shape == (9, 112, 112, 3)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), idents)
    np.testing.assert_array_equal(np.concatenate([b[2] for b in batches]), range(1, 10))
    for img, data in zip(images, jpegs):
        np.testing.assert_array_equal(img, decode(data))


def test_a_packed_folder_and_the_folder_itself_load_without_transforms(tmp_path):
    src = tmp_path / "images"
    jpegs = folder(src, 10, (36, 52))
    report = stoker.pack(src, tmp_path / "train", workers=1, progress=False)
    for path in (report.manifest, str(src)):
        with stoker.Loader(path, batch_size=4, workers=2, seed=0) as loader:
            got = [(b.images.copy(), b.labels.copy()) for b in loader]
        images = np.concatenate([g[0] for g in got])
        assert images.shape == (10, 36, 52, 3), path
        assert np.concatenate([g[1] for g in got]).tolist() == [0] * 5 + [1] * 5
        for img, data in zip(images, jpegs):
            np.testing.assert_array_equal(img, decode(data))


def test_transforms_that_keep_the_size_need_no_resize_either(tmp_path):
    folder(tmp_path / "images", 6, (30, 20))
    chain = Compose([HorizontalFlip(p=1.0), Normalize((0.5,) * 3, (0.25,) * 3)])
    with stoker.Loader(
        tmp_path / "images", batch_size=3, transforms=chain, workers=0, layout="NCHW"
    ) as loader:
        b = next(iter(loader))
        assert b.images.shape == (3, 3, 30, 20) and b.images.dtype == np.float32


def test_a_size_open_resize_over_one_size_decodes_at_a_reduced_scale(tmp_path):
    """Resize(28, shorter_side=True) leaves the size to the image: over a set of one size the
    image is decoded at 1/4 scale (its decode hint) and still counts as the set's size."""
    folder(tmp_path / "images", 4, (112, 112))
    chain = Resize(28, shorter_side=True)
    with stoker.Loader(tmp_path / "images", batch_size=4, transforms=chain, workers=0) as ld:
        b = next(iter(ld))
    assert b.images.shape == (4, 28, 28, 3)
    full = DecodeOptions(scale_on_decode=False)
    with stoker.Loader(
        tmp_path / "images", batch_size=4, transforms=chain, workers=0, decode=full
    ) as ld:
        assert next(iter(ld)).images.shape == (4, 28, 28, 3)


def test_a_folder_of_mixed_sizes_is_still_refused_naming_two_sizes(tmp_path):
    folder(tmp_path / "mixed", 6, (36, 52), odd={3: (20, 30)})
    with pytest.raises(SpecError) as info:
        stoker.Loader(tmp_path / "mixed", batch_size=2, workers=0)
    message = str(info.value)
    assert "the images differ in size" in message
    assert "is 36x52" in message and "is 20x30" in message
    assert "class_1/03.jpg" in message and "add a Resize or RandomCrop" in message


@pytest.fixture(scope="module")
def one_odd(tmp_path_factory):
    """20 images of 36x52 and, at position 1 (which the first look over the set passes by),
    one of 20x30; packed, so the error names a record key."""
    root = tmp_path_factory.mktemp("odd")
    folder(root / "images", 20, (36, 52), odd={1: (20, 30)})
    return stoker.pack(root / "images", root / "train", workers=1, progress=False).manifest


@pytest.mark.parametrize("workers", [0, 2])
def test_an_image_of_another_size_is_an_error_naming_its_key_and_both_sizes(one_odd, workers):
    with stoker.Loader(one_odd, batch_size=4, workers=workers, seed=0) as loader:
        with pytest.raises(SpecError) as info:
            for _ in loader:
                pass
    message = str(info.value)
    assert "key 1 (position 1)" in message
    assert "the image is 20x30" in message and "every image to be 36x52" in message
    assert "the set's first image" in message
    if workers:
        assert isinstance(info.value, WorkerError) and info.value.key == 1


def test_under_on_error_skip_an_image_of_another_size_is_dropped(one_odd):
    with stoker.Loader(
        one_odd, batch_size=4, workers=2, seed=0, on_error="skip", max_bad_fraction=0.1
    ) as loader:
        keys = [k for b in loader for k in b.keys.tolist()]
        assert keys == [k for k in range(20) if k != 1]
        assert [r["key"] for r in loader.rejects] == [1]
        assert "the image is 20x30" in loader.rejects[0]["reason"]


def test_under_on_error_skip_the_commonest_size_seen_is_taken(tmp_path):
    # the first image is the odd one, and the look over the set sees it
    src = tmp_path / "images"
    folder(src, 8, (36, 52), odd={0: (20, 30)})
    shutil.rmtree(src / "class_1")  # 4 images: 20x30, then three of 36x52
    with stoker.Loader(
        src, batch_size=4, workers=0, seed=0, on_error="skip", max_bad_fraction=0.5
    ) as loader:
        assert loader.output_spec.shape == (36, 52, 3)
        assert [k for b in loader for k in b.keys.tolist()] == [1, 2, 3]


def test_a_crop_larger_than_the_images_is_refused_at_construction(tmp_path):
    """RandomCrop(300) over a set of 112-px images (issue 34, item 7): the loader reads the
    first image's header at construction and refuses the chain there, naming the image and
    both sizes, before any worker starts; a Resize before the crop makes it fine."""
    from stoker.transforms import RandomCrop, Resize

    root = tmp_path / "faces"
    folder(root, 4, (112, 112))
    stoker.pack(root, tmp_path / "train", workers=1, progress=False)
    manifest = str(tmp_path / "train.stoker.json")
    with pytest.raises(SpecError) as info:
        stoker.Loader(manifest, batch_size=2, transforms=Compose([RandomCrop(300)]), workers=2)
    message = str(info.value)
    assert "key 0" in message and "is 112x112" in message
    assert "smaller than the crop 300x300" in message and "Resize" in message
    chain = Compose([Resize(320, shorter_side=True), RandomCrop(300)])
    with stoker.Loader(manifest, batch_size=2, transforms=chain, workers=0) as loader:
        assert next(iter(loader)).images.shape == (2, 300, 300, 3)
