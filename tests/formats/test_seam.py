"""The seam: a format is one module and one registry line.

``ToyReader`` below is a complete format that nothing in stoker knows about: a ``.toy`` file (a
JSON list of base64 JPEGs with their keys and labels) read as a :class:`stoker.formats.Reader`.
Registered with one ``Format`` line pointing at this module, it loads through ``stoker.Loader``
(with worker processes, which import this module to unpickle the reader), ``RecordDataset``,
``stoker inspect``, ``stoker verify``, ``stoker unpack`` and the doctor, with no other change.
"""

from __future__ import annotations

import base64
import json
import os
import pickle

import numpy as np
import pytest
import simplejpeg

import stoker
from stoker._core.schema import Schema
from stoker._core.seeding import sample_rng
from stoker.cli import main
from stoker.codecs import decode
from stoker.formats import Reader, format_of, open_reader
from stoker.formats.registry import FORMATS, Format, register
from stoker.formats.report import Problem, VerifyReport
from stoker.loader.sources import as_source
from stoker.transforms import CenterCrop, Compose, HorizontalFlip, RandomCrop

N, CLASSES = 22, ("ant", "bee", "cat")


class ToyReader(Reader):
    """A ``.toy`` file: ``[{"key": int, "label": int, "jpeg": base64}, ...]``; opened on first
    use in the process that reads it, pickled as its path."""

    format = "toy"

    def __init__(self, path: str) -> None:
        self.path = os.fspath(path)
        self._items: list[dict] | None = None

    def _load(self) -> list[dict]:
        if self._items is None:
            with open(self.path, "rb") as f:
                self._items = json.loads(f.read())
        return self._items

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def __len__(self) -> int:
        return len(self._load())

    def keys(self) -> np.ndarray:
        return np.array([it["key"] for it in self._load()], np.int64)

    @property
    def schema(self) -> Schema:
        return Schema.classification((), "int64")

    def labels(self) -> np.ndarray:
        return np.array([it["label"] for it in self._load()], np.int64)

    @property
    def class_names(self) -> list[str]:
        return list(CLASSES)

    def reader(self, indices=None, fields=()):
        items = self._load()

        def f(i: int):
            it = items[i]
            return base64.b64decode(it["jpeg"]), np.int64(it["label"]), int(it["key"]), {}

        return f

    def describe(self, i: int) -> str:
        return f"toy sample {i} (key {self.key(i)}) of {self.path}"

    def fingerprint(self) -> dict:
        return {"type": "toy", "len": len(self), "keys": self.keys().tolist()}


def open_toy(path: str, **options) -> ToyReader:
    return ToyReader(path, **options)


def verify_toy(path, *, checksums=True, decode=None, max_problems=1000, progress=None):
    report = VerifyReport(os.fspath(path), max_problems=max_problems)
    r = ToyReader(path)
    get = r.reader()
    for i in range(len(r)):
        report.records += 1
        if decode is not None:
            try:
                decode(get(i)[0])
                report.decoded += 1
            except Exception as e:  # noqa: BLE001 - a problem in the report
                report.add(Problem(r.path, r.key(i), None, str(e)))
    return report


@pytest.fixture(autouse=True)
def toy_format():
    """The one line that adds the format (and its removal after the test)."""
    register(Format("toy", f"{__name__}:open_toy", (".toy",), verify=f"{__name__}:verify_toy"))
    yield
    FORMATS.pop("toy", None)


def _images(n: int = N) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    out = []
    for i in range(n):
        h, w = 24 + (i % 3) * 4, 28 + (i % 2) * 6
        img = np.zeros((h, w, 3), np.uint8)
        img[:] = rng.integers(0, 256, 3, dtype=np.uint8)  # a flat colour per sample
        img[: h // 2, : w // 3] = 255 - img[0, 0]
        out.append(img)
    return out


@pytest.fixture
def toy(tmp_path) -> tuple[str, list[bytes], list[int], list[int]]:
    blobs = [simplejpeg.encode_jpeg(im, quality=95) for im in _images()]
    keys = [1000 + 7 * i for i in range(N)]
    labels = [i % len(CLASSES) for i in range(N)]
    items = [
        {"key": k, "label": lab, "jpeg": base64.b64encode(b).decode("ascii")}
        for k, lab, b in zip(keys, labels, blobs)
    ]
    path = tmp_path / "set.toy"
    path.write_text(json.dumps(items))
    return str(path), blobs, keys, labels


TRANSFORMS = Compose([CenterCrop(20), RandomCrop(16), HorizontalFlip()])


def test_the_registry_opens_it_and_the_loader_takes_its_source(toy):
    path, blobs, keys, labels = toy
    assert format_of(path).name == "toy"
    with open_reader(path) as r:
        assert isinstance(r, ToyReader) and len(r) == N
        assert bytes(r.reader()(3)[0]) == blobs[3]
    src, owned = as_source(path)
    assert owned and isinstance(src, ToyReader) and src.format == "toy"
    assert len(pickle.dumps(src)) < 1000  # the reader travels as its path
    assert src.labels().tolist() == labels and src.keys().tolist() == keys
    assert src.image_sizes()[4].tolist() == [24 + (4 % 3) * 4, 28]
    src.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_over_the_toy_format(toy, workers):
    path, blobs, keys, labels = toy
    kw = dict(batch_size=6, transforms=TRANSFORMS, shuffle=True, seed=11)
    with stoker.Loader(path, workers=workers, **kw) as ld:
        got = [(b.images.copy(), b.labels.copy(), b.keys.copy(), b.indices.copy()) for b in ld]
        state = ld.state_dict()
    order = np.concatenate([g[3] for g in got])
    assert sorted(order.tolist()) == list(range(N))
    assert np.concatenate([g[2] for g in got]).tolist() == [keys[i] for i in order]
    labs = np.concatenate([g[1] for g in got])
    assert labs.dtype == np.int64 and labs.tolist() == [labels[i] for i in order]
    # each image is the stored JPEG through the transforms with the sample's own generator
    images = np.concatenate([g[0] for g in got])
    for row, i in enumerate(order.tolist()):
        rng = sample_rng(11, 0, i)
        np.testing.assert_array_equal(images[row], TRANSFORMS(decode(blobs[i]), rng))
    assert state["dataset"]["type"] == "toy"


def test_record_dataset_inspect_verify_unpack_and_doctor(toy, tmp_path, capsys):
    import stoker.torch as st

    path, blobs, keys, labels = toy
    ds = st.RecordDataset(path, transforms=TRANSFORMS, seed=11)
    with stoker.Loader(path, batch_size=N, transforms=TRANSFORMS, seed=11, workers=0) as ld:
        batch = next(iter(ld))
    for i in (0, 5, N - 1):
        img, lab = ds[i]
        np.testing.assert_array_equal(img.numpy(), batch.images[i])
        assert lab == labels[i] and ds.class_names == list(CLASSES)
    ds.close()

    assert main(["inspect", path, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "toy" and info["records"] == N and info["classes"] == len(CLASSES)
    assert info["per_class"] == {"ant": 8, "bee": 7, "cat": 7}
    assert info["images"]["formats"] == {"JPEG": N} and info["images"]["height"]["max"] == 32

    assert main(["verify", path, "--decode", "--quiet"]) == 0
    out = tmp_path / "out"
    assert main(["unpack", path, str(out), "--quiet"]) == 0
    assert (out / "bee" / f"{keys[1]}.jpg").read_bytes() == blobs[1]
    assert sum(1 for _ in out.rglob("*.jpg")) == N

    from stoker.doctor import diagnose

    report = diagnose(
        path, transforms=CenterCrop(16), batch_size=4, workers_max=1, seconds=1.0,
        sample_size=8, step_time_ms=1.0, progress=False,
    )  # fmt: skip
    assert report.data["source"]["kind"] == "records" and report.data["source"]["count"] == N
    assert report.data["source"]["total_bytes"] == os.path.getsize(path)
    assert {"read records (cold)", "read records (warm)"} <= {s["name"] for s in report.stages}
    assert report.loader_measured.get(1, 0) > 0, report.not_measured


def test_verify_reports_a_bad_sample_of_the_toy_format(toy, capsys):
    path, *_ = toy
    with open(path) as f:
        items = json.load(f)
    items[4]["jpeg"] = base64.b64encode(b"\xff\xd8\xff not a jpeg").decode("ascii")
    with open(path, "w") as f:
        json.dump(items, f)
    assert main(["verify", path, "--decode"]) == 1
    assert f"{path}, key {1000 + 28}:" in capsys.readouterr().out
    with pytest.raises(stoker.WorkerError) as e:
        with stoker.Loader(path, batch_size=N, transforms=CenterCrop(16), workers=2) as ld:
            next(iter(ld))
    assert f"toy sample 4 (key {1000 + 28}) of {path}" in str(e.value)


def test_a_path_no_format_claims_is_refused_by_name(tmp_path, capsys):
    bad = tmp_path / "set.unknown"
    bad.write_bytes(b"x")
    with pytest.raises(ValueError, match=r"set\.unknown: cannot tell its format"):
        stoker.Loader(str(bad), batch_size=2)
    assert main(["inspect", str(bad)]) == 2
    assert "cannot tell its format" in capsys.readouterr().err
