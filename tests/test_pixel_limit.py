"""Decompression bombs on the read side: an image whose header declares more pixels than
``max_pixels`` is refused before any pixel is decoded, by ``decode``, by the loader (naming the
key; skipped with ``on_error="skip"``), by ``stoker verify --decode`` and by ``RecordDataset``;
``DecodeOptions(max_pixels=...)`` moves the limit for the loader."""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import numpy as np
import pytest
from PIL import Image

from stoker import ImageDecodeError, ImageTooLargeError, Loader, WorkerError
from stoker.cli import main as cli_main
from stoker.codecs import DEFAULT_MAX_PIXELS, decode
from stoker.formats.recordio import IRHeader, RecordWriter, pack_header
from stoker.loader import FolderSource
from stoker.pipeline import DecodeOptions
from stoker.transforms import Resize

BOMB_KEY = 4242


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(w: int = 10_000, h: int = 10_000) -> bytes:
    """A real, fully decodable 1-bit greyscale PNG of ``w`` x ``h`` black pixels: ~12 KB on
    disk, 300 MB once decoded to RGB."""
    row = b"\x00" * (1 + (w + 7) // 8)  # filter byte 0 + packed bits
    comp = zlib.compressobj(9)
    body = b"".join(comp.compress(row) for _ in range(h)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")
    )


def small(h: int = 32, w: int = 32, fmt: str = "PNG") -> bytes:
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([xx * 7, yy * 5, xx + yy], axis=-1).astype(np.uint8)
    b = io.BytesIO()
    Image.fromarray(arr).save(b, fmt)
    return b.getvalue()


def jpeg_bomb(w: int = 30_000, h: int = 30_000) -> bytes:
    """A small JPEG whose SOF0 is patched to declare ``w`` x ``h``."""
    data = bytearray(small(16, 16, "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", h, w)
    return bytes(data)


@pytest.fixture(scope="module")
def png10k() -> bytes:
    data = png_bomb()
    assert len(data) < 50_000
    return data


@pytest.fixture(params=["png", "jpeg"])
def bomb(request, png10k) -> tuple[str, bytes, str]:
    if request.param == "png":
        return ".png", png10k, "10000x10000"
    return ".jpg", jpeg_bomb(), "30000x30000"


def test_the_png_bomb_is_a_real_image(png10k):
    with pytest.warns(Image.DecompressionBombWarning), Image.open(io.BytesIO(png10k)) as im:
        assert im.size == (10_000, 10_000) and im.mode == "1"
    assert DEFAULT_MAX_PIXELS == 89_478_485


# ---------------------------------------------------------------- (a) decode, before allocating
_RSS_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    from stoker.codecs import decode
    from stoker import ImageTooLargeError

    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux

    warm = [open(p, "rb").read() for p in sys.argv[2:]]
    for w in warm:  # load every backend first: their imports are not the image's cost
        decode(w)
    data = open(sys.argv[1], "rb").read()
    before = rss()
    try:
        decode(data)
    except ImageTooLargeError as e:
        print("REFUSED", e)
    else:
        print("DECODED")
    print("GROWTH_KIB", rss() - before)
    """
)


def test_decode_refuses_before_allocating(tmp_path, bomb):
    ext, data, declared = bomb
    path = tmp_path / f"bomb{ext}"
    path.write_bytes(data)
    warm = []
    for fmt in ("PNG", "JPEG", "WEBP"):
        p = tmp_path / f"warm.{fmt.lower()}"
        p.write_bytes(small(fmt=fmt))
        warm.append(str(p))
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(path), *warm],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "REFUSED" in out.stdout, out.stdout
    assert declared in out.stdout and "89,478,485" in out.stdout and "max_pixels" in out.stdout
    growth_kib = int(out.stdout.split("GROWTH_KIB")[1])
    assert growth_kib < 50 * 1024, f"RSS grew by {growth_kib} KiB"


def test_decode_error_is_an_image_decode_error(bomb):
    _, data, declared = bomb
    with pytest.raises(ImageTooLargeError, match=declared) as info:
        decode(data)
    assert isinstance(info.value, ImageDecodeError)
    assert "DecodeOptions(max_pixels=" in str(info.value)


# ---------------------------------------------------------------- (b) the loader
def _folder(tmp_path, bomb_data: bytes, ext: str):
    root = tmp_path / "imgs"
    (root / "cls").mkdir(parents=True)
    for i in range(6):
        (root / "cls" / f"ok{i}.png").write_bytes(small())
    (root / "cls" / f"bomb{ext}").write_bytes(bomb_data)
    key = FolderSource(root).listing.index(os.path.join("cls", f"bomb{ext}"))
    return str(root), key


def _rec(tmp_path, bomb_data: bytes):
    path = str(tmp_path / "data.rec")
    with RecordWriter(path) as w:
        keys = [1, 2, 3, BOMB_KEY, 5, 6, 7]
        for k in keys:
            data = bomb_data if k == BOMB_KEY else small()
            w.write(k, pack_header(IRHeader(0, 0.0, k, 0), data))
    return path, BOMB_KEY


@pytest.fixture(params=["folder", "rec"])
def dataset(request, tmp_path, bomb):
    ext, data, declared = bomb
    if request.param == "folder":
        src, key = _folder(tmp_path, data, ext)
    else:
        src, key = _rec(tmp_path, data)
    return src, key, declared


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_raises_naming_the_key(dataset, workers):
    src, key, declared = dataset
    with Loader(src, batch_size=7, transforms=Resize((16, 16)), workers=workers) as ld:
        with pytest.raises(WorkerError) as info:
            list(ld)
    msg = str(info.value)
    assert f"key {key}" in msg and declared in msg and "max_pixels" in msg, msg


def test_loader_skips_it_and_lists_the_reject(dataset):
    src, key, declared = dataset
    with Loader(
        src,
        batch_size=7,
        transforms=Resize((16, 16)),
        workers=2,
        on_error="skip",
        max_bad_fraction=0.5,
    ) as ld:
        keys = [int(k) for b in ld for k in b.keys]
        rejects = list(ld.rejects)
    assert key not in keys and len(keys) == 6
    assert [r["key"] for r in rejects] == [key]
    assert "ImageTooLargeError" in rejects[0]["reason"] and declared in rejects[0]["reason"]


# ---------------------------------------------------------------- (c) stoker verify --decode
def test_verify_decode_names_the_key(tmp_path, bomb, capsys):
    _, data, declared = bomb
    path, key = _rec(tmp_path, data)
    assert cli_main(["verify", path, "--quiet"]) == 0  # the framing is fine
    capsys.readouterr()
    assert cli_main(["verify", path, "--decode", "--quiet"]) != 0
    out = capsys.readouterr().out
    assert str(key) in out and declared in out and "max_pixels" in out, out


# ---------------------------------------------------------------- (d) torch RecordDataset
def test_record_dataset_raises(tmp_path, bomb):
    pytest.importorskip("torch")
    from stoker.torch import RecordDataset

    _, data, declared = bomb
    path, _ = _rec(tmp_path, data)
    with RecordDataset(path) as ds:
        assert tuple(ds[0][0].shape) == (32, 32, 3)
        with pytest.raises(ImageTooLargeError, match=declared):
            ds[3]


# ---------------------------------------------------------------- (e) DecodeOptions moves it
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_decode_options_max_pixels(tmp_path, fmt):
    root = tmp_path / "imgs"
    (root / "cls").mkdir(parents=True)
    for i in range(4):
        (root / "cls" / f"{i}.{fmt.lower()}").write_bytes(small(32, 32, fmt))
    kw = dict(batch_size=4, transforms=Resize((16, 16)), workers=0)
    with Loader(str(root), decode=DecodeOptions(max_pixels=100), **kw) as ld:
        with pytest.raises(WorkerError, match=r"key 0 .*32x32.* over the limit of 100"):
            list(ld)
    for limit in (None, 32 * 32, DEFAULT_MAX_PIXELS):
        with Loader(str(root), decode=DecodeOptions(max_pixels=limit), **kw) as ld:
            (batch,) = list(ld)
            assert batch.images.shape == (4, 16, 16, 3)


def test_decode_options_checks_max_pixels():
    assert DecodeOptions().max_pixels == DEFAULT_MAX_PIXELS
    assert DecodeOptions(max_pixels=np.int64(5)).max_pixels == 5
    for bad, err in ((0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(err, match="max_pixels"):
            DecodeOptions(max_pixels=bad)
