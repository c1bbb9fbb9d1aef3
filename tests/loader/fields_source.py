"""A real in-memory source of JPEG images with fields: boxes drawn into the image (a bright
rectangle on a dark, textured background), their classes and centre points, a PNG label map of
the same rectangles, a caption, opaque bytes and a score vector.

Every sample's truth is kept beside its encoded bytes, so a test can check what the loader
delivers against it, and each rectangle's pixels say where its box must be after any move.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from stoker import ArraySpec
from stoker._core.schema import Field, Schema
from stoker.loader import Source

#: Pixel value inside a drawn rectangle, and the background's highest.
BRIGHT, DARK = 250, 60
MAX_BOXES = 3


def schema(*, max_len: bool = True) -> Schema:
    m = (lambda n: n) if max_len else (lambda n: None)
    return Schema(
        {
            "image": Field.image(),
            "label": Field.numeric((), "int64", header=True),
            "boxes": Field.boxes(max_len=m(MAX_BOXES)),
            "classes": Field.ragged((), "int64", follows="boxes", max_len=m(MAX_BOXES)),
            "centres": Field.points((3,), follows="boxes", max_len=m(MAX_BOXES)),
            "mask": Field.mask(),
            "caption": Field.text(max_len=m(40)),
            "blob": Field.bytes_(max_len=m(6)),
            "score": Field.numeric((2,), "float32"),
        }
    )


def _sample(i: int, hw: tuple[int, int]) -> dict[str, Any]:
    """One sample's pixels and fields; rectangles do not overlap (one per horizontal band)."""
    rng = np.random.default_rng(1000 + i)
    h, w = hw
    img = rng.integers(0, DARK, size=(h, w, 3), dtype=np.uint8)
    img = cv2.GaussianBlur(img, (5, 5), 0)
    mask = np.zeros((h, w), np.uint8)
    n = i % (MAX_BOXES + 1)
    band = h // MAX_BOXES
    boxes, classes, centres = [], [], []
    for j in range(n):
        bh = int(rng.integers(8, band - 2))
        bw = int(rng.integers(10, w // 2))
        r0 = j * band + int(rng.integers(0, band - bh))
        c0 = int(rng.integers(0, w - bw))
        img[r0 : r0 + bh, c0 : c0 + bw] = BRIGHT
        cls = 1 + (i + j) % 4
        mask[r0 : r0 + bh, c0 : c0 + bw] = cls
        boxes.append([c0, r0, c0 + bw, r0 + bh])
        classes.append(cls)
        centres.append([c0 + bw / 2, r0 + bh / 2, 1.0])
    ok, jpg = cv2.imencode(".jpg", img[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
    ok2, png = cv2.imencode(".png", mask)
    assert ok and ok2
    return {
        "jpeg": jpg.tobytes(),
        "label": i % 5,
        "boxes": np.asarray(boxes, np.float32).reshape(-1, 4),
        "classes": np.asarray(classes, np.int64),
        "centres": np.asarray(centres, np.float32).reshape(-1, 3),
        "mask": png.tobytes(),
        "mask_array": mask,
        "caption": "sample " + "ü" * (i % 4) + str(i),
        "blob": bytes(range(i % 7)),
        "score": np.asarray([i, -i / 2], np.float32),
    }


class FieldsSource(Source):
    """``n`` samples of size ``hw`` (or of the sizes in ``sizes``, cycled); ``bad`` positions
    hold bytes that are no image. Keys are ``100 + position``."""

    def __init__(
        self,
        n: int,
        *,
        hw: tuple[int, int] = (48, 64),
        sizes: list[tuple[int, int]] | None = None,
        bad: tuple[int, ...] = (),
        schema_: Schema | None = None,
    ) -> None:
        self.sizes = [tuple(sizes[i % len(sizes)]) if sizes else hw for i in range(n)]
        self.samples = [_sample(i, self.sizes[i]) for i in range(n)]  # type: ignore[arg-type]
        for i in bad:
            self.samples[i] = dict(self.samples[i], jpeg=b"\xff\xd8\xff\xe0 not a jpeg")
        self._schema = schema_ if schema_ is not None else schema()

    def __len__(self) -> int:
        return len(self.samples)

    def key(self, i: int) -> int:
        return 100 + int(i)

    def keys(self) -> np.ndarray:
        return 100 + np.arange(len(self), dtype=np.int64)

    def labels(self) -> np.ndarray:
        return np.asarray([s["label"] for s in self.samples], np.int64)

    def read(self, i: int) -> tuple[Any, Any]:
        s = self.samples[i]
        return s["jpeg"], s["label"]

    def fingerprint(self) -> dict:
        return {"type": "FieldsSource", "n": len(self)}

    @property
    def sample_spec(self) -> ArraySpec:
        if len(set(self.sizes)) == 1:
            return ArraySpec((*self.sizes[0], 3), "uint8")
        return ArraySpec((None, None, 3), "uint8")

    @property
    def schema(self) -> Schema:
        return self._schema

    def reader(self, indices: np.ndarray | None = None, fields: tuple[str, ...] = ()):
        stored, names = self._schema.stored, fields
        for n in names:
            if n not in stored:
                raise KeyError(n)

        def read(i: int):
            s = self.samples[i]
            vals = {n: stored[n].check(s[n], name=n) for n in names}
            return s["jpeg"], s["label"], self.key(i), vals

        return read


def all_batches(batches) -> list[dict]:
    """Every batch of one pass, copied out of the ring."""
    out = []
    for b in batches:
        out.append(
            {
                "images": b.images.copy(),
                "labels": b.labels.copy(),
                "indices": b.indices.copy(),
                "fields": {k: v.copy() for k, v in b.fields.items()},
                "lengths": {k: v.copy() for k, v in b.lengths.items()},
            }
        )
    return out


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["indices"], y["indices"])
        np.testing.assert_array_equal(x["images"], y["images"])
        np.testing.assert_array_equal(x["labels"], y["labels"])
        assert x["fields"].keys() == y["fields"].keys()
        for k in x["fields"]:
            assert x["fields"][k].tobytes() == y["fields"][k].tobytes(), k
        for k in x["lengths"]:
            np.testing.assert_array_equal(x["lengths"][k], y["lengths"][k])
