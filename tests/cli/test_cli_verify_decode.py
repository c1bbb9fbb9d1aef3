"""`stoker verify --decode` lists every record whose image does not decode (a truncated JPEG,
damaged entropy data, a 0-byte image) with its file, key and byte offset, and exits 1; one bad
image never ends the walk, whatever the decoder's exception holds on to."""

from __future__ import annotations

import gc
import io
import tarfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _cli_util import verify_json
from PIL import Image

from stoker._core.schema import Schema
from stoker.formats.recordio import IRHeader, RecordWriter, pack_header, verify_records
from stoker.formats.tfrecord import open_writer
from stoker.formats.tfrecord import verify as verify_tfrecord
from stoker.formats.wds import verify as verify_wds


def _jpeg(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _images() -> list[bytes]:
    """Six images: good, truncated, good, entropy data damaged (two bytes in the scan turned
    into a marker no decoder knows), 0 bytes, good."""
    good = _jpeg(0)
    sos = good.index(b"\xff\xda")
    mid = (sos + len(good)) // 2
    damaged = good[:mid] + b"\xff\x80" + good[mid + 2 :]
    return [good, good[: len(good) // 2], _jpeg(1), damaged, b"", _jpeg(2)]


BAD = [1, 3, 4]


def test_recordio_every_undecodable_image_is_listed(tmp_path):
    rec = str(tmp_path / "d.rec")
    with RecordWriter(rec, checksums=True) as w:
        for k, img in enumerate(_images()):
            w.write(k, pack_header(IRHeader(0, float(k), k, 0), img))
    rc, rep = verify_json(rec, "--decode")
    assert rc == 1
    assert [p["key"] for p in rep["problems"]] == BAD
    assert rep["decoded"] == 3 and rep["records"] == 6
    with open(rec[:-4] + ".idx") as f:
        idx = {int(k): int(o) for k, o in (line.split("\t") for line in f)}
    for p in rep["problems"]:
        assert p["offset"] == idx[p["key"]] and p["path"] == rec
        assert "image does not decode" in p["reason"]
    assert "0 bytes" in rep["problems"][2]["reason"]


def test_tfrecord_every_undecodable_image_is_listed(tmp_path):
    w = open_writer(tmp_path / "d", None, schema=Schema.classification())
    offsets = []
    for k, img in enumerate(_images()):
        if not img:
            continue  # the writer refuses an empty image; the reader's check covers that
        offsets.append(w.bytes_written)
        w.write(k, img, k)
    path = w.commit()["files"]["data"]
    rc, rep = verify_json(path, "--decode")
    assert rc == 1
    assert [(p["key"], p["offset"]) for p in rep["problems"]] == [(1, offsets[1]), (3, offsets[3])]
    assert all("image does not decode" in p["reason"] for p in rep["problems"])
    assert rep["decoded"] == 3


class _Held(ValueError):
    pass


def _cyclic_decoder(buf: bytes) -> None:
    """A decoder whose exception sits in a local of the frame that raises it: a reference
    cycle that keeps its frames (and, through them, its callers') alive until a collection."""
    try:
        raise _Held(f"bad image of {len(buf)} bytes")
    except _Held as e:
        kept = e
    raise kept


def _written(tmp_path, fmt: str, images: list[bytes]) -> tuple[str, Callable[..., Any]]:
    """``images`` as a set of ``fmt``; its path and that format's verify."""
    if fmt == "recordio":
        path = str(tmp_path / "d.rec")
        with RecordWriter(path, checksums=True) as w:
            for k, img in enumerate(images):
                w.write(k, pack_header(IRHeader(0, float(k), k, 0), img))
        return path, verify_records
    if fmt == "tfrecord":
        tw = open_writer(tmp_path / "d", None, schema=Schema.classification())
        for k, img in enumerate(images):
            tw.write(k, img, k)
        return tw.commit()["files"]["data"], verify_tfrecord
    path = str(tmp_path / "d.tar")
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for k, img in enumerate(images):
            info = tarfile.TarInfo(f"s{k:03d}.jpg")
            info.size = len(img)
            tar.addfile(info, io.BytesIO(img))
    return path, verify_wds


def _verify_without_collections(run: Callable[..., Any], path: str, decode: Any) -> Any:
    """``run(path, decode=decode)`` with the garbage collector off, so that no collection
    that happens to run breaks a decoder's reference cycle."""
    gc.disable()
    try:
        return run(path, decode=decode, progress=False)
    finally:
        gc.enable()


@pytest.mark.parametrize("fmt", ["recordio", "tfrecord", "wds"])
def test_a_decoder_exception_in_a_reference_cycle_does_not_end_the_walk(tmp_path, fmt):
    path, run = _written(tmp_path, fmt, [_jpeg(k) for k in range(4)])
    rep = _verify_without_collections(run, path, _cyclic_decoder)
    assert [p.key for p in rep.problems] == [0, 1, 2, 3]
    assert all("_Held: bad image" in p.reason for p in rep.problems)


def _cyclic_but_fine(buf: bytes) -> None:
    """A decoder that succeeds but leaves its frame in a reference cycle (an exception it
    handled, kept in a local)."""
    try:
        raise _Held("handled")
    except _Held as e:
        kept = e
    assert kept is not None


@pytest.mark.parametrize("fmt", ["recordio", "tfrecord", "wds"])
def test_a_decoder_that_succeeds_and_leaves_a_cycle_does_not_break_the_walk(tmp_path, fmt):
    path, run = _written(tmp_path, fmt, [_jpeg(k) for k in range(3)])
    rep = _verify_without_collections(run, path, _cyclic_but_fine)
    assert rep.ok and rep.decoded == 3
