"""Label kinds for bare files (a ``.rec`` or a ``.tfrecord`` without a manifest): the kind is
inferred from every record, not from record 0, and a label that does not fit it is refused as
a manifest set refuses it. One bad label (a missing one, 2.5, 1e30, NaN) at the first, a
middle or the last of 18 records is named in one line, with its file, key and byte offset, by
``stoker verify`` and by the loader; the set never turns to -1 or to float. A TFRecord file
without any label feature is unlabelled, as documented (every label -1)."""

from __future__ import annotations

import numpy as np
import pytest
import simplejpeg

from stoker._core.errors import CorruptRecordError
from stoker.cli import main
from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.loader import Loader

N = 18
AT = [0, N // 2, N - 1]  # the first, a middle and the last record
BAD = {"missing": None, "2.5": 2.5, "1e30": 1e30, "nan": float("nan")}
REASON = {
    ("recordio", "2.5"): "not a whole number within int64",
    ("recordio", "1e30"): "not a whole number within int64",
    ("recordio", "nan"): "is not a finite number",
    ("tfrecord", "missing"): "has no feature 'image/class/label'",
    ("tfrecord", "2.5"): "holds floats, the field is int64",
    ("tfrecord", "1e30"): "holds floats, the field is int64",
    ("tfrecord", "nan"): "holds floats, the field is int64",
}


def _jpeg(k: int) -> bytes:
    rng = np.random.default_rng(k)
    return simplejpeg.encode_jpeg(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))


def _rec(path: str, bad: float, at: int) -> list[int]:
    """A bare ``.rec`` of class ids ``k % 3`` but ``bad`` at record ``at``; its offsets."""
    w = RecordWriter(path, checksums=True)
    for k in range(N):
        w.write(k, pack_header(IRHeader(0, bad if k == at else float(k % 3), k, 0), _jpeg(k)))
    w.commit()
    with open(path[:-4] + ".idx") as f:
        return [int(line.split("\t")[1]) for line in f]


def _tfrecord(path: str, bad: float | None, at: int | None, labelled: bool = True) -> None:
    """A bare ``.tfrecord`` (written by another tool) of int64 class ids ``k % 3``; record
    ``at`` has ``bad`` as a float label, or none when ``bad`` is None."""
    from tfrecord import TFRecordWriter

    w = TFRecordWriter(path)
    for k in range(N):
        feats = {"image/encoded": (_jpeg(k), "byte")}
        if labelled and k != at:
            feats["image/class/label"] = (k % 3, "int")
        elif labelled and bad is not None:
            feats["image/class/label"] = (bad, "float")
        w.write(feats)
    w.close()


CASES = [(f, b, at) for f in ("recordio", "tfrecord") for b in BAD for at in AT]
CASES = [c for c in CASES if (c[0], c[1]) in REASON]  # a .rec label cannot be missing


@pytest.mark.parametrize("fmt, bad, at", CASES)
def test_one_bad_label_is_refused_in_one_line_by_verify_and_the_loader(
    tmp_path, capsys, fmt, bad, at
):
    reason = REASON[fmt, bad]
    if fmt == "recordio":
        path = str(tmp_path / "s.rec")
        where = f"key {at}, byte offset {_rec(path, BAD[bad], at)[at]}"
    else:
        path = str(tmp_path / "s.tfrecord")
        _tfrecord(path, BAD[bad], at)
        where = f"key {at}, byte offset "
    assert main(["verify", path, "--quiet"]) == 1
    problems = [x for x in capsys.readouterr().out.splitlines() if x.startswith("problem:")]
    assert len(problems) == 1 and where in problems[0] and reason in problems[0], problems
    with pytest.raises(CorruptRecordError) as e:
        with Loader(path, batch_size=6, shuffle=False, workers=0) as ld:
            list(ld)
    message = str(e.value)
    assert "\n" not in message and path in message and where in message and reason in message
    if fmt == "recordio":  # the other records keep their class ids (TFRecord stops at open)
        with Loader(path, batch_size=6, shuffle=False, workers=0, on_error="skip",
                    max_bad_fraction=0.5) as ld:  # fmt: skip
            labels = np.concatenate([np.asarray(b.labels) for b in ld])
        assert labels.dtype == np.int64
        assert labels.tolist() == [k % 3 for k in range(N) if k != at]


def test_a_tfrecord_without_any_label_is_unlabelled(tmp_path):
    path = str(tmp_path / "u.tfrecord")
    _tfrecord(path, None, None, labelled=False)
    assert main(["verify", path, "--quiet"]) == 0
    with Loader(path, batch_size=6, shuffle=False, workers=0) as ld:
        labels = np.concatenate([np.asarray(b.labels) for b in ld])
    assert labels.tolist() == [-1] * N
