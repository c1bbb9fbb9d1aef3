"""An IRHeader label that is NaN or infinite, under a valid CRC: the loader raises naming the
file, key and byte offset, or skips the sample (``on_error``), and the other labels stay int64
class ids (``stoker verify`` lists such labels: ``tests/cli/test_cli_verify_labels.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from _recordio_util import write_rec

from stoker._core.errors import CorruptRecordError
from stoker.formats.recordio import IRHeader, pack_header
from stoker.loader import Loader
from stoker.loader.sources.records import RecordSource

LABELS = [0.0, 1.0, float("nan"), 2.0, float("inf"), 1.0, 0.0, 2.0]
BAD = (2, 4)


def _jpeg(seed: int) -> bytes:
    import simplejpeg

    rng = np.random.default_rng(seed)
    return simplejpeg.encode_jpeg(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_raises_or_skips_a_non_finite_label(tmp_path, workers):
    payloads = [pack_header(IRHeader(0, lab, k, 0), _jpeg(k)) for k, lab in enumerate(LABELS)]
    rec = write_rec(tmp_path, payloads, name="d")
    with open(rec[:-4] + ".idx") as f:
        offsets = [int(line.split("\t")[1]) for line in f]
    src = RecordSource(rec)
    labels = src.labels()
    assert labels.dtype == np.int64  # one bad label does not make the set float32
    assert [int(x) for i, x in enumerate(labels) if i not in BAD] == [0, 1, 2, 1, 0, 2]
    kw = dict(batch_size=4, workers=workers, shuffle=False)
    with Loader(src, on_error="skip", max_bad_fraction=0.5, **kw) as ld:
        got = {int(k): int(lab) for b in ld for k, lab in zip(b.keys, b.labels)}
        assert got == {k: int(LABELS[k]) for k in range(len(LABELS)) if k not in BAD}
        assert sorted(r["key"] for r in ld.rejects) == list(BAD)
        assert all("is not a finite number" in r["reason"] for r in ld.rejects)
    with Loader(src, **kw) as ld:
        with pytest.raises(CorruptRecordError, match=f"key 2, byte offset {offsets[2]}") as e:
            list(ld)
        assert (e.value.path, e.value.offset, e.value.key) == (rec, offsets[2], 2)
        assert "label nan is not a finite number" in str(e.value)
