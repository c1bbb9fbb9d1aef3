"""Preset chains: shapes, value ranges, the seed recipes."""

from __future__ import annotations

import numpy as np
import pytest

import stoker.transforms as T
from stoker._core.seeding import sample_rng
from stoker._core.specs import ArraySpec
from stoker.transforms import presets

from .conftest import make_image


def test_seed000_chain_matches_the_seed_steps():
    img = make_image(112, 112)
    chain = presets.seed000_train(128)
    resize, crop, flip, norm = chain.transforms
    assert resize == T.Resize((146, 146))  # int(128 * 128 / 112)
    assert crop == T.RandomCrop(128) and flip == T.HorizontalFlip(0.5)
    out = chain(img, sample_rng(0, 0, 0))
    assert out.shape == (128, 128, 3) and out.dtype == np.float32
    assert -1.0 <= out.min() and out.max() <= 1.0
    # normalisation = (x/255 - 0.5)/0.5 of the uint8 variant's output
    u8 = T.get_preset("seed000-uint8")(img, sample_rng(0, 0, 0))
    np.testing.assert_allclose(out, u8 / 127.5 - 1.0, atol=1e-6)


def test_kanji_distort_on_the_seed_images():
    img = make_image(64, 64, channels=None)  # the seed's 64x64 'L' images
    chain = T.get_preset("kanji")
    geometric, filters = chain.transforms
    assert [type(t).__name__ for t in geometric.transforms] == [
        "Rotate",
        "Shear",
        "ScaleTranslate",
        "SineWarp",
    ]
    assert geometric.transforms[2] == T.ScaleTranslate(25, 63)
    assert [type(t).__name__ for t in filters.transforms] == ["GaussianBlur", "Sharpen", "Smooth"]
    outs = [chain(img, sample_rng(0, 0, i)) for i in range(40)]
    assert all(o.shape == (64, 64) and o.dtype == np.uint8 for o in outs)
    assert len({o.tobytes() for o in outs}) >= 35  # SineWarp shifts are whole pixels: a few repeat
    assert chain.output_spec(ArraySpec((64, 64, 1))) == ArraySpec((64, 64, 1))


def test_imagenet_presets():
    img = make_image(90, 120)
    assert T.get_preset("imagenet", size=64)(img, sample_rng(0, 0, 0)).shape == (64, 64, 3)
    ev = T.get_preset("imagenet-eval", size=64)
    assert ev.output_spec(ArraySpec((None, None, 3))) == ArraySpec((64, 64, 3))
    assert ev(img, sample_rng(0, 0, 0)).shape == (64, 64, 3)
    assert ev.decode_hint((900, 1200)) == (73, 97)  # int(64 * 256 / 224) on the shorter side


def test_get_preset_names():
    assert list(T.PRESETS) == sorted(T.PRESETS)
    for name in T.PRESETS:
        assert isinstance(T.get_preset(name), T.Compose)
    img = make_image()
    assert T.get_preset("none")(img, sample_rng(0, 0, 0)) is img
    with pytest.raises(
        ValueError, match="unknown transform preset 'sd000'; choose one of imagenet"
    ):
        T.get_preset("sd000")
    with pytest.raises(ValueError, match="positive int"):
        T.get_preset("kanji", size=0)
