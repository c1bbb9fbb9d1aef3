"""RecordDataset as a torchvision ``ImageFolder`` user meets it: an insightface (MS1M) ``.rec``
gives its images only, plain functions as transforms, ``targets``/``classes``/
``class_to_idx``, channels-first tensors, all through a real DataLoader with workers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import stoker
import stoker.torch as st
from stoker.codecs import decode
from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.pack import make_sample_data
from stoker.transforms import CenterCrop, Compose, Normalize

pytestmark = pytest.mark.timeout(120)

#: images per identity of the insightface set
PER_IDENTITY = (3, 1, 4, 2)


def _jpeg(seed: int) -> bytes:
    import cv2

    rng = np.random.default_rng(seed)
    img = np.full((20, 16, 3), rng.integers(0, 256, 3), np.uint8)
    img[: 2 + seed % 10] = 255 - img[0, 0]  # a different picture for each key
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    """An MS1M-layout ``.rec`` as insightface's face2rec writes it: header record 0 (flag 2,
    labels ``(a, b)``, written last), images 1..a-1 labelled by identity, identity records
    a..b-1 with each identity's ``[start, end)`` keys. Returns the path and the images."""
    rec = tmp_path_factory.mktemp("faces") / "train.rec"
    idents = [j for j, n in enumerate(PER_IDENTITY) for _ in range(n)]
    a = 1 + len(idents)
    b = a + len(PER_IDENTITY)
    jpegs = [_jpeg(k) for k in range(1, a)]
    with RecordWriter(rec) as w:
        for k, ident in enumerate(idents, start=1):
            w.write(k, pack_header(IRHeader(0, float(ident), k, 0), jpegs[k - 1]))
        start = 1
        for j, n in enumerate(PER_IDENTITY):
            w.write(a + j, pack_header(IRHeader(0, [start, start + n], 0, 0), b""))
            start += n
        w.write(0, pack_header(IRHeader(0, [a, b], 0, 0), b""))
    return rec, jpegs, idents


@pytest.fixture(scope="module")
def folder_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    images = make_sample_data(root / "images", classes=3, per_class=4, size=24, workers=1)
    return stoker.pack(images, root / "train", workers=1, progress=False).manifest, images


def flip_rows(img):
    """A plain function of the image alone (module level: picklable for spawned workers)."""
    return img[::-1]


def test_an_insightface_rec_gives_its_images_only(faces):
    rec, jpegs, idents = faces
    with st.RecordDataset(rec) as ds:
        assert len(ds) == len(jpegs) == 10  # not 15: header and identity records are no samples
        img, label = ds[0]
        assert torch.equal(img, torch.from_numpy(decode(jpegs[0])))  # key 1, the first image
        assert label == 0 and isinstance(label, int)
        assert [ds[i][1] for i in range(len(ds))] == idents
        assert torch.equal(ds[-1][0], torch.from_numpy(decode(jpegs[-1])))


def test_targets_classes_and_class_to_idx_of_an_insightface_set(faces):
    rec, _, idents = faces
    with st.RecordDataset(rec) as ds:
        assert ds.targets == idents and all(type(t) is int for t in ds.targets)
        # no class names in the set: the identity ids as strings, classes[target] works
        assert ds.classes == ["0", "1", "2", "3"]
        assert ds.class_to_idx == {"0": 0, "1": 1, "2": 2, "3": 3}
        assert all(ds.classes[t] == str(t) for t in ds.targets)


def test_targets_and_classes_of_a_packed_folder_are_imagefolders(folder_set):
    manifest, images = folder_set
    folders = sorted(e.name for e in os.scandir(images) if e.is_dir())
    with st.RecordDataset(manifest) as ds:
        assert ds.classes == folders  # the folder names, sorted, as ImageFolder gives them
        assert ds.class_to_idx == {name: j for j, name in enumerate(folders)}
        assert ds.targets == [ds[i][1] for i in range(len(ds))]
        assert sorted(set(ds.targets)) == [0, 1, 2] and len(ds.targets) == 12


def test_labels_that_are_not_class_ids_have_targets_but_no_classes(tmp_path):
    rec = tmp_path / "scores.rec"
    with RecordWriter(rec) as w:
        for k in range(3):
            w.write(k, pack_header(IRHeader(0, 0.25 * k + 0.1, k, 0), _jpeg(k)))
    with st.RecordDataset(rec) as ds:
        assert ds.targets == pytest.approx([0.1, 0.35, 0.6])
        with pytest.raises(ValueError, match="not class ids"):
            ds.classes  # noqa: B018 - the property raises


@pytest.mark.parametrize("fn", [flip_rows, lambda img, rng: img[:, ::-1]])
def test_a_plain_function_is_a_transform(faces, fn):
    rec, jpegs, _ = faces
    with st.RecordDataset(rec, transforms=fn) as ds:
        img = decode(jpegs[2])
        want = img[::-1] if fn is flip_rows else img[:, ::-1]
        assert torch.equal(ds[2][0], torch.from_numpy(np.ascontiguousarray(want)))


def test_a_function_with_rng_draws_from_seed_epoch_and_index(faces):
    rec, _, _ = faces

    def noise(img, rng):
        return np.clip(img.astype(np.int16) + rng.integers(-20, 21, img.shape), 0, 255).astype(
            np.uint8
        )

    a = st.RecordDataset(rec, transforms=noise, seed=3)
    b = st.RecordDataset(rec, transforms=noise, seed=3)
    assert torch.equal(a[4][0], b[4][0])
    b.set_epoch(1)
    assert not torch.equal(a[4][0], b[4][0])
    a.close()
    b.close()
    with pytest.raises(TypeError, match="a callable f\\(img\\)"):
        st.RecordDataset(rec, transforms="flip")


def test_layout_chw_gives_channels_first(faces):
    rec, jpegs, _ = faces
    with st.RecordDataset(rec, layout="CHW") as ds:
        img, _ = ds[1]
        assert img.shape == (3, 20, 16) and img.dtype == torch.uint8 and img.is_contiguous()
        assert torch.equal(img, torch.from_numpy(decode(jpegs[1])).permute(2, 0, 1))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    with st.RecordDataset(rec, transforms=Normalize(mean, std), layout="CHW") as ds:
        x = ds[1][0]
    # what torchvision's ToTensor() then Normalize(mean, std) give
    ref = torch.from_numpy(decode(jpegs[1])).permute(2, 0, 1).float() / 255
    ref = (ref - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    assert x.dtype == torch.float32 and torch.allclose(x, ref, atol=1e-5)


def test_layout_is_checked(faces):
    rec, _, _ = faces
    with pytest.raises(ValueError, match="transposed twice"):
        st.RecordDataset(
            rec, transforms=Normalize((0.5,) * 3, (0.5,) * 3, layout="CHW"), layout="CHW"
        )
    with pytest.raises(ValueError, match="one sample has no batch axis: 'CHW'"):
        st.RecordDataset(rec, layout="NCHW")


def test_in_a_dataloader_with_workers(faces):
    rec, jpegs, idents = faces
    ds = st.RecordDataset(rec, transforms=Compose([flip_rows, CenterCrop(16)]), layout="CHW")
    dl = DataLoader(ds, batch_size=4, num_workers=2, shuffle=False)
    images, labels = zip(*dl, strict=True)
    x, y = torch.cat(images), torch.cat(labels)
    assert x.shape == (10, 3, 16, 16) and x.dtype == torch.uint8
    assert y.tolist() == idents == ds.targets
    for i in (0, 5, 9):  # each image once, in order, flipped then cropped
        ref = decode(jpegs[i])[::-1][2:18]
        assert torch.equal(x[i], torch.from_numpy(np.ascontiguousarray(ref)).permute(2, 0, 1))
    # a sampler built from targets, as ImageFolder users weight their classes
    counts = np.bincount(ds.targets)
    weights = [1.0 / counts[t] for t in ds.targets]
    sampler = torch.utils.data.WeightedRandomSampler(weights, num_samples=40)
    drawn = [int(t) for _, yb in DataLoader(ds, batch_size=8, sampler=sampler) for t in yb]
    assert len(drawn) == 40 and set(drawn) <= set(range(len(ds.classes)))
    ds.close()


@pytest.mark.slow
def test_in_a_spawned_dataloader(faces):
    """Under spawn (macOS's and Windows's default) each DataLoader worker gets the dataset
    pickled as its configuration and reopens the set: the same samples as without workers."""
    rec, _, _ = faces
    ds = st.RecordDataset(rec, transforms=Compose([flip_rows, CenterCrop(16)]), layout="CHW")
    want = [(x.clone(), y.clone()) for x, y in DataLoader(ds, batch_size=4)]
    dl = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    got = list(dl)
    assert len(got) == len(want) == 3
    for (x1, y1), (x2, y2) in zip(got, want, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    ds.close()
