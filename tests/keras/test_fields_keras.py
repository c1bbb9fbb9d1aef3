"""Keras 3 ``model.fit`` (torch backend, CPU) on batches with fields: dict inputs by field name,
variable fields padded with their lengths, through the loader's worker processes."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest

import stoker
from stoker import ArraySpec
from stoker._core.schema import Field, Schema
from stoker.keras import KerasDataset
from stoker.loader import Source

pytestmark = pytest.mark.timeout(120)

SCHEMA = Schema(
    {
        "image": Field.image(),
        "label": Field.numeric((), "int64", header=True),
        "boxes": Field.boxes(max_len=2),
        "classes": Field.ragged((), "int64", follows="boxes", max_len=2),
        "score": Field.numeric((2,), "float32"),
        "caption": Field.text(max_len=8),
    }
)


class CountSource(Source):
    """Sample i: a dark 16x16 image with ``i % 3`` bright squares, their boxes and classes; its
    label is the number of squares; ``score`` and ``caption`` are functions of i."""

    encoded = False

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def key(self, i: int) -> int:
        return int(i)

    def keys(self) -> np.ndarray:
        return np.arange(self.n, dtype=np.int64)

    def labels(self) -> np.ndarray:
        return np.arange(self.n, dtype=np.int64) % 3

    def fingerprint(self) -> dict:
        return {"type": "CountSource", "n": self.n}

    @property
    def schema(self) -> Schema:
        return SCHEMA

    @property
    def sample_spec(self) -> ArraySpec:
        return ArraySpec((16, 16, 3), "uint8")

    def sample(self, i: int) -> tuple[np.ndarray, dict[str, Any]]:
        img = np.full((16, 16, 3), 20, np.uint8)
        boxes = [[1 + 8 * j, 2, 6 + 8 * j, 7] for j in range(i % 3)]
        for x1, y1, x2, y2 in boxes:
            img[y1:y2, x1:x2] = 230
        return img, {
            "boxes": np.asarray(boxes, np.float32).reshape(-1, 4),
            "classes": np.arange(1, 1 + i % 3, dtype=np.int64),
            "score": np.asarray([i, -i], np.float32),
            "caption": f"n{i % 3}",
        }

    def read(self, i: int) -> tuple[Any, Any]:
        return self.sample(i)[0], int(i % 3)

    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()):
        def read(i: int):
            img, vals = self.sample(i)
            return img, int(i % 3), i, {n: vals[n] for n in fields}

        return read


def _loader(n: int = 96, **kw: Any) -> stoker.Loader:
    kw.setdefault("workers", 2)
    kw.setdefault("shuffle", True)
    return stoker.Loader(CountSource(n), batch_size=16, seed=3, **kw)


def test_dict_inputs_hold_every_field_padded_with_lengths():
    source = CountSource(32)
    with KerasDataset(_loader(32, shuffle=False, workers=0)) as ds:
        x, y = ds[0]
    assert set(x) == {
        "image",
        "boxes",
        "boxes_lengths",
        "classes",
        "classes_lengths",
        "score",
        "caption",
        "caption_lengths",
    }
    rows = np.arange(16)
    assert x["image"].shape == (16, 16, 16, 3) and x["image"].dtype == np.uint8
    assert x["boxes"].shape == (16, 2, 4) and x["classes"].shape == (16, 2)
    assert np.array_equal(x["boxes_lengths"], (rows % 3).astype(np.int32))
    assert np.array_equal(y, rows % 3)
    for r in rows:
        img, vals = source.sample(int(r))
        k = int(r % 3)
        assert np.array_equal(x["image"][r], img)
        assert np.array_equal(x["boxes"][r, :k], vals["boxes"])
        assert not x["boxes"][r, k:].any()  # zero past each row's length
        assert np.array_equal(x["score"][r], vals["score"])
        n = x["caption_lengths"][r]
        assert x["caption"][r, :n].tobytes().decode() == vals["caption"]


def test_inputs_and_targets_pick_fields():
    with KerasDataset(
        _loader(32, workers=0), inputs=["image", "score"], targets=["classes"], x_dtype="float32"
    ) as ds:
        x, y = ds[0]
    assert set(x) == {"image", "score"} and x["image"].dtype == np.float32
    assert set(y) == {"classes", "classes_lengths"}
    with KerasDataset(_loader(32, workers=0), inputs=["image", "nope"]) as ds:
        with pytest.raises(KeyError, match="no field 'nope'"):
            ds[0]
    with pytest.raises(TypeError, match="list of field names"):
        KerasDataset(_loader(32, workers=0), inputs="image")


def test_without_fields_x_stays_an_array():
    with KerasDataset(_loader(32, workers=0, fields=[])) as ds:
        x, y = ds[0]
    assert isinstance(x, np.ndarray) and x.shape == (16, 16, 16, 3)


@pytest.mark.slow  # trains until it learns (14 s); the fields' dataset and batches run by default
def test_multi_input_fit_on_two_workers_learns_from_the_fields():
    """The label (how many squares) is in both the image and the boxes' lengths: a model fed
    the image, the padded boxes and their lengths by name fits it."""
    image = keras.Input((16, 16, 3), name="image")
    boxes = keras.Input((2, 4), name="boxes")
    count = keras.Input((), name="boxes_lengths", dtype="int32")
    feats = keras.layers.Concatenate()(
        [
            keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3)(image)),
            keras.layers.Flatten()(boxes) / 16.0,
            keras.layers.CategoryEncoding(3, output_mode="one_hot")(count),
        ]
    )
    model = keras.Model([image, boxes, count], keras.layers.Dense(3)(feats))
    model.compile(
        optimizer=keras.optimizers.Adam(3e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    with KerasDataset(_loader(), inputs=["image"], x_dtype="float32") as ds:
        with pytest.raises(ValueError, match='Missing data for input "boxes"'):
            model.fit(ds, epochs=1, verbose=0)  # inputs are matched by name
    # "boxes" brings "boxes_lengths" along
    with KerasDataset(_loader(), inputs=["image", "boxes"], x_dtype="float32") as ds:
        history = model.fit(ds, epochs=6, verbose=0)
    assert history.history["accuracy"][-1] >= 0.95
