"""Every op: declared spec == what comes back, pickling, per-sample determinism, inputs untouched."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

import stoker.transforms as T
from stoker._core.seeding import sample_rng
from stoker._core.specs import ArraySpec

from .conftest import make_image

# (op, works on grey HW/HWC1 inputs too)
OPS = [
    T.Resize((24, 30)),
    T.Resize(20, shorter_side=True),
    T.Resize(33, shorter_side=True, interpolation="area"),
    T.RandomCrop(32),
    T.RandomCrop((20, 44), padding=3, fill=7),
    T.CenterCrop((31, 17)),
    T.RandomResizedCrop(24),
    T.RandomResizedCrop((16, 24), scale=(0.3, 0.6), interpolation="nearest"),
    T.HorizontalFlip(0.5),
    T.Rotate(15),
    T.Rotate((-30, 5), fill=200, interpolation="bilinear"),
    T.Shear(0.2, 0.2),
    T.Shear((0.1, 0.3), 0.0, center=True, interpolation="bicubic"),
    T.ScaleTranslate(10, 39),
    T.SineWarp((0.15, 0.2)),
    T.SineWarp(0.3, period=0.25),
    T.GaussianBlur((0.5, 1.2)),
    T.Sharpen(),
    T.Smooth(),
    T.ColorJitter(0.4, 0.4, 0.4),
    T.Grayscale(3),
    T.Grayscale(1),
    T.Normalize(0.5, 0.5),
    T.Normalize(0.5, 0.25, layout="CHW", dtype="float16"),
    T.Compose([T.Resize((36, 36)), T.RandomCrop(32), T.HorizontalFlip()]),
    T.RandomChoice([T.Rotate(10), T.Shear(0.1, 0.1), T.SineWarp()]),
    T.OneOf([T.Sharpen(), T.Smooth()], weights=[3, 1], p=0.7),
    T.RandomApply(T.GaussianBlur(1.0), p=0.5),
    T.get_preset("kanji", size=40),
    T.get_preset("seed000", size=32),
]
IDS = [repr(op)[:60] for op in OPS]
RANDOM = (
    T.RandomCrop,
    T.RandomResizedCrop,
    T.HorizontalFlip,
    T.Rotate,
    T.Shear,
    T.ScaleTranslate,
    T.SineWarp,
    T.GaussianBlur,
    T.ColorJitter,
    T.Compose,
    T.RandomChoice,
    T.RandomApply,
)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_output_matches_declared_spec(op, any_image):
    img = any_image
    spec = op.output_spec(ArraySpec(img.shape, "uint8"))
    assert spec.fixed
    for index in range(6):
        out = op(img, sample_rng(1, 0, index))
        assert isinstance(out, np.ndarray)
        assert out.shape == spec.shape, (op, img.shape)
        assert out.dtype == np.dtype(spec.dtype)


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_unknown_sizes_propagate_as_none(op):
    spec = op.output_spec(ArraySpec((None, None, 3), "uint8"))
    assert len(spec.shape) == 3
    assert (
        spec.shape[2] == 3
        or (isinstance(op, T.Grayscale) and spec.shape[2] == 1)
        or (isinstance(op, T.Normalize) and op.layout == "CHW")
    )


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_pickle_round_trip_keeps_behaviour(op, rgb):
    clone = pickle.loads(pickle.dumps(op))
    assert clone == op
    assert repr(clone) == repr(op)
    np.testing.assert_array_equal(clone(rgb, sample_rng(5, 2, 9)), op(rgb, sample_rng(5, 2, 9)))


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_same_seed_epoch_index_same_output_and_input_untouched(op, rgb):
    before = rgb.copy()
    a = op(rgb, sample_rng(7, 3, 11))
    b = op(rgb, sample_rng(7, 3, 11))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(rgb, before)


@pytest.mark.parametrize(
    "op", [op for op in OPS if isinstance(op, RANDOM)], ids=lambda o: repr(o)[:60]
)
def test_other_epochs_and_indices_differ(op, rgb):
    outs = [op(rgb, sample_rng(7, epoch, 11)) for epoch in range(8)]
    assert any(not np.array_equal(outs[0], o) for o in outs[1:])
    outs = [op(rgb, sample_rng(7, 0, index)) for index in range(8)]
    assert any(not np.array_equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("op", OPS, ids=IDS)
def test_views_with_odd_strides_are_accepted(op):
    big = make_image(60, 70)
    for view in (big[5:45, 10:58], big[:40, ::-1][:, :48]):
        out = op(view, sample_rng(0, 0, 1))
        ref = op(np.ascontiguousarray(view), sample_rng(0, 0, 1))
        np.testing.assert_array_equal(out, ref)


_CHILD = """
import sys
import numpy as np
from stoker._core.seeding import sample_rng
from stoker.transforms import get_preset
img = np.load(sys.argv[1])
outs = [get_preset("kanji")(img, sample_rng(3, e, i)) for e, i in [(0, 5), (0, 6), (1, 5), (1, 6)]]
np.save(sys.argv[2], np.stack(outs))
"""


def test_same_augmentation_in_another_process(tmp_path):
    img = make_image(64, 64, channels=None)
    np.save(tmp_path / "in.npy", img)
    cmd = [sys.executable, "-c", _CHILD, str(tmp_path / "in.npy"), str(tmp_path / "out.npy")]
    subprocess.run(cmd, check=True, timeout=60)
    remote = np.load(tmp_path / "out.npy")
    local = [
        T.get_preset("kanji")(img, sample_rng(3, e, i)) for e, i in [(0, 5), (0, 6), (1, 5), (1, 6)]
    ]
    np.testing.assert_array_equal(remote, np.stack(local))
    assert not np.array_equal(remote[0], remote[2])  # epoch 1 differs from epoch 0


def test_ops_draw_only_from_the_rng_handed_in(rgb):
    np.random.seed(0)
    state = np.random.get_state()[1].copy()
    for op in OPS:
        op(rgb, sample_rng(0, 0, 0))
    np.testing.assert_array_equal(np.random.get_state()[1], state)


def test_public_names_sorted_and_present():
    assert list(T.__all__) == sorted(T.__all__)
    for name in T.__all__:
        assert hasattr(T, name)


def test_import_does_not_load_cv2():
    code = "import sys, stoker.transforms; print('cv2' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
