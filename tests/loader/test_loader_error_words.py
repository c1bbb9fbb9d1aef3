"""Errors that say what to do: a plain function that loses the size names its step and
``output="same"``; a file that does not decode is one short error that says
``on_error="skip"`` and ``stoker pack`` (its cause in ``__cause__``, no worker traceback in
the text); no object reprs; cache sizes in binary units."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import stoker
from stoker._core.errors import size_text, without_reprs
from stoker.loader import Loader
from stoker.transforms import Compose, RandomResizedCrop


def brighten(img: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return img


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("words")
    return stoker.make_sample_data(root / "imgs", classes=2, per_class=4, size=48, workers=1)


def test_a_plain_function_that_loses_the_size_is_named_with_output_same(folder, tmp_path):
    chain = Compose([RandomResizedCrop(32), brighten])
    with Loader(folder, batch_size=4, transforms=chain, workers=0) as ld:  # learnt from image 0
        assert next(iter(ld)).images.shape == (4, 32, 32, 3)
    # where the first image does not read, nothing tells the size: the error names the step
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    first = sorted(p for p in bad.rglob("*.jpg"))[0]
    first.write_bytes(b"not an image")
    with pytest.raises(stoker.SpecError) as info:
        Loader(str(bad), batch_size=4, transforms=chain, workers=0)
    text = str(info.value)
    assert "step 1 (as_transform(brighten)) loses the size" in text
    assert "step 0 (RandomResizedCrop) gives (32x32)" in text
    assert 'as_transform(brighten, output="same")' in text
    assert "no transforms fix" not in text and "RandomCrop/Resize missing" not in text


def test_a_truncated_jpeg_is_one_short_error_that_says_what_to_do(tmp_path):
    src = stoker.make_sample_data(tmp_path / "imgs", classes=2, per_class=4, size=32, workers=1)
    victim = sorted((src / "class_01").iterdir())[1]
    victim.write_bytes(victim.read_bytes()[:200])
    with pytest.raises(stoker.ImageDecodeError) as info:
        with Loader(
            src, batch_size=4, transforms=Compose([RandomResizedCrop(16)]), workers=0
        ) as ld:
            for _ in ld:
                pass
    text = str(info.value)
    assert "\n" not in text and "Traceback" not in text
    assert str(victim) in text and 'on_error="skip"' in text and "stoker pack" in text
    cause = info.value.__cause__
    assert isinstance(cause, stoker.ImageDecodeError) and "corrupt JPEG" in str(cause)
    assert "Traceback" in info.value.remote_traceback  # kept, out of the message


def test_uncaught_it_prints_a_short_traceback(tmp_path):
    src = stoker.make_sample_data(tmp_path / "imgs", classes=1, per_class=4, size=32, workers=1)
    victim = sorted((src / "class_00").iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:200])
    script = textwrap.dedent(
        f"""
        from stoker.loader import Loader
        with Loader({str(src)!r}, batch_size=2, workers=0) as ld:
            for _ in ld:
                pass
        """
    )
    err = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True).stderr
    assert err.count("Traceback") == 1 and len(err.splitlines()) < 25, err
    assert 'on_error="skip"' in err.splitlines()[-1]


def test_too_many_bad_samples_names_no_object_reprs(tmp_path):
    src = stoker.make_sample_data(tmp_path / "imgs", classes=1, per_class=4, size=32, workers=1)
    sorted((src / "class_00").iterdir())[2].write_bytes(b"not an image at all" * 8)
    with pytest.raises(stoker.TooManyBadSamplesError) as info:
        with Loader(src, batch_size=2, workers=0, on_error="skip") as ld:
            for _ in ld:
                pass
    text = str(info.value)
    assert "cannot identify image file" in text and "object at 0x" not in text
    assert without_reprs("file <_io.BytesIO object at 0x7f01>; x") == "file; x"


def test_sizes_are_written_in_binary_units():
    assert size_text(512) == "512 bytes"
    assert size_text(109_025) == "106.5 KiB"
    assert size_text(59 * 2**20 + 1) == "59.1 MiB"  # rounded up: enough to raise a budget to
    assert size_text(3 * 2**30) == "3.0 GiB"
