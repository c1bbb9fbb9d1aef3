"""`stoker pack --layout insightface`: the bytes insightface's reader expects (a golden layout
built here from the spec, not from stoker's writer), read back by stoker's reader of the
layout, unpack → pack giving the same bytes, and the options it rules out. The slow test reads
and writes the same set with MXNet 1.9.1 itself, in a venv of its own."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pack.packhelp import image_bytes
from stoker.cli import main
from stoker.formats import open_reader
from stoker.formats.recordio import RecordWriter, pack_header
from stoker.formats.recordio.header import IRHeader

MAGIC = 0xCED7230A


def _frame(payload: bytes) -> bytes:
    """One dmlc record as MXNet writes it: magic, length word (cflag 0), payload, zero pad."""
    pad = (-len(payload)) % 4
    return struct.pack("<II", MAGIC, len(payload)) + payload + b"\0" * pad


def _ir(flag: int, label: float, id_: int, labels: tuple[float, ...] = ()) -> bytes:
    return struct.pack("<IfQQ", flag, label, id_, 0) + struct.pack(f"<{len(labels)}f", *labels)


def _folder(root, per_identity: dict[str, int]) -> dict[str, list[bytes]]:
    """root/<identity>/<i>.jpg; each identity's JPEG bytes in name order."""
    got = {}
    seed = 0
    for name, n in per_identity.items():
        os.makedirs(root / name)
        got[name] = []
        for i in range(n):
            data = image_bytes((16, 12), seed=seed)
            seed += 1
            (root / name / f"img{i}.jpg").write_bytes(data)
            got[name].append(data)
    return got


def test_the_rec_and_idx_are_insightfaces_layout_byte_for_byte(tmp_path):
    images = _folder(tmp_path / "src", {"alice": 2, "bob": 1, "carol": 3})
    out = tmp_path / "out" / "faces"
    assert main(["pack", str(tmp_path / "src"), str(out), "--layout", "insightface"]) == 0
    # images are keys 1..6 labelled by identity, then header 0 = (7, 10), then identities 7..9
    rec, idx, off, key = b"", "", 0, 1
    for label, name in enumerate(("alice", "bob", "carol")):
        for data in images[name]:
            frame = _frame(_ir(0, float(label), key) + data)
            idx += f"{key}\t{off}\n"
            rec, off, key = rec + frame, off + len(frame), key + 1
    records = [(0, _ir(2, 0.0, 0, (7.0, 10.0)))]
    records += [(7 + j, _ir(2, 0.0, 7 + j, r)) for j, r in enumerate([(1, 3), (3, 4), (4, 7)])]
    for k, payload in records:
        idx += f"{k}\t{off}\n"
        rec += _frame(payload)
        off += len(_frame(payload))
    assert (tmp_path / "out" / "faces.rec").read_bytes() == rec
    assert (tmp_path / "out" / "faces.idx").read_text() == idx


def test_stokers_reader_sees_the_images_and_the_identities(tmp_path, capsys):
    _folder(tmp_path / "src", {"a": 3, "b": 2})
    out = tmp_path / "faces"
    assert main(["pack", str(tmp_path / "src"), str(out), "--layout", "insightface"]) == 0
    capsys.readouterr()
    r = open_reader(f"{out}.stoker.json")
    try:
        assert len(r) == 5  # the images alone
        assert r.labels().tolist() == [0, 0, 0, 1, 1]
        table = r.identity_table()
        assert table["header"]["label"] == [6, 8]
        assert [(i["start_key"], i["end_key"]) for i in table["identities"]] == [(1, 4), (4, 6)]
    finally:
        r.close()
    assert main(["verify", f"{out}.stoker.json", "--decode"]) == 0
    manifest = json.loads((tmp_path / "faces.stoker.json").read_text())
    assert manifest["pack"]["layout"] == "insightface"


def _jpeg(k: int) -> bytes:
    return image_bytes((8, 8), seed=100 + k)


def _face2rec_set(path, n_ids: int) -> None:
    """A set as insightface's face2rec/dir2rec writes it, without a manifest: one image per
    identity (so 11 identities give folders 0..10, which sort as text in another order)."""
    a, b = n_ids + 1, 2 * n_ids + 1
    with RecordWriter(path) as w:
        for k in range(1, a):
            w.write(k, pack_header(IRHeader(0, float(k - 1), k, 0), _jpeg(k)))
        w.write(0, pack_header(IRHeader(2, np.array([a, b], np.float32), 0, 0), b""))
        for j in range(n_ids):
            w.write(a + j, pack_header(IRHeader(2, np.array([j + 1, j + 2], np.float32), a + j, 0)))


def test_unpack_then_pack_gives_the_same_bytes(tmp_path):
    # a set packed by stoker, with an identity of 11 images (names 1..11: "10" sorts before "2")
    _folder(tmp_path / "src", {"x": 11, "y": 2})
    first = tmp_path / "one" / "faces"
    assert main(["pack", str(tmp_path / "src"), str(first), "--layout", "insightface"]) == 0
    assert main(["unpack", f"{first}.stoker.json", str(tmp_path / "un"), "--quiet"]) == 0
    again = tmp_path / "two" / "faces"
    assert main(["pack", str(tmp_path / "un"), str(again), "--layout", "insightface"]) == 0
    for ext in (".rec", ".idx"):
        assert (tmp_path / "two" / f"faces{ext}").read_bytes() == (
            tmp_path / "one" / f"faces{ext}"
        ).read_bytes()


def test_unpack_then_pack_of_a_face2rec_set_keeps_its_identity_order(tmp_path):
    orig = tmp_path / "train.rec"
    _face2rec_set(orig, 11)
    assert main(["unpack", str(orig), str(tmp_path / "un"), "--quiet"]) == 0
    assert sorted(os.listdir(tmp_path / "un"))[:3] == ["0", "1", "10"]
    again = tmp_path / "re" / "train"
    assert main(["pack", str(tmp_path / "un"), str(again), "--layout", "insightface"]) == 0
    assert (tmp_path / "re" / "train.rec").read_bytes() == orig.read_bytes()
    assert (tmp_path / "re" / "train.idx").read_bytes() == (tmp_path / "train.idx").read_bytes()


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--shard-size", "2"], "shard_size"),
        (["--shuffle"], "shuffle"),
        (["--format", "wds"], "format='wds'"),
        (["--labels", "none"], "labels='none'"),
        (["--max-rejects", "3"], "max_rejects"),
    ],
)
def test_what_the_layout_rules_out_is_one_line(tmp_path, capsys, extra, says):
    _folder(tmp_path / "src", {"a": 1})
    argv = ["pack", str(tmp_path / "src"), str(tmp_path / "o"), "--layout", "insightface"]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "insightface" in err and says in err
    assert not os.path.exists(tmp_path / "o.rec")


def test_a_rejected_image_stops_an_insightface_pack(tmp_path, capsys):
    _folder(tmp_path / "src", {"a": 2, "b": 1})
    (tmp_path / "src" / "a" / "img1.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    argv = ["pack", str(tmp_path / "src"), str(tmp_path / "o"), "--layout", "insightface"]
    assert main([*argv, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "insightface layout keeps every image" in err and "o.rejects.tsv" in err
    assert not os.path.exists(tmp_path / "o.rec")


# ---------------------------------------------------------------- MXNet itself (slow)

_MX_READ = textwrap.dedent(
    """
    import numbers, sys
    import mxnet as mx
    prefix, out = sys.argv[1], sys.argv[2]
    # as insightface's MXFaceDataset reads a set
    rec = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "r")
    header, _ = mx.recordio.unpack(rec.read_idx(0))
    assert header.flag > 0, header
    a, b = int(header.label[0]), int(header.label[1])
    labels, shapes, ranges = [], set(), []
    for i in range(1, a):
        h, img = mx.recordio.unpack(rec.read_idx(i))
        label = h.label if isinstance(h.label, numbers.Number) else h.label[0]
        labels.append(int(label))
        shapes.add(mx.image.imdecode(img).shape)
    for j in range(a, b):
        h, _ = mx.recordio.unpack(rec.read_idx(j))
        ranges.append([int(h.label[0]), int(h.label[1])])
    print(a, b, labels, ranges, sorted(shapes))
    # and writes it as insightface's dir2rec does: images, header 0, identities
    w = mx.recordio.MXIndexedRecordIO(out + ".idx", out + ".rec", "w")
    for i in range(1, a):
        _, img = mx.recordio.unpack(rec.read_idx(i))
        w.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, labels[i - 1], i, 0), img))
    w.write_idx(0, mx.recordio.pack(mx.recordio.IRHeader(2, [float(a), float(b)], 0, 0), b""))
    for j, (s, e) in enumerate(ranges):
        h = mx.recordio.IRHeader(2, [float(s), float(e)], a + j, 0)
        w.write_idx(a + j, mx.recordio.pack(h, b""))
    w.close()
    """
)


def _python_for_mxnet() -> str | None:
    """A Python MXNet 1.9.1 runs under (3.8 to 3.11)."""
    if sys.version_info[:2] <= (3, 11):
        return sys.executable
    for minor in (11, 10, 9, 8):
        found = shutil.which(f"python3.{minor}")
        if found:
            return found
    return None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mxnet_reads_the_set_and_writes_the_same_bytes(tmp_path):
    python = _python_for_mxnet()
    if python is None:
        pytest.skip("MXNet 1.9.1 needs Python 3.8-3.11; none found")
    venv = tmp_path / "mx"
    subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
    got = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "mxnet==1.9.1", "numpy<1.24"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if got.returncode != 0:
        pytest.skip(f"MXNet 1.9.1 cannot be installed here: {got.stderr.strip()[-300:]}")
    _folder(tmp_path / "src", {"a": 3, "b": 1, "c": 2})
    out = tmp_path / "faces"
    assert main(["pack", str(tmp_path / "src"), str(out), "--layout", "insightface"]) == 0
    script = tmp_path / "mx_read.py"
    script.write_text(_MX_READ)
    mx = str(tmp_path / "mxnet")
    ran = subprocess.run(
        [str(venv / "bin" / "python"), str(script), str(out), mx],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert (
        ran.stdout.split("\n")[-2]
        == "7 10 [0, 0, 0, 1, 2, 2] [[1, 4], [4, 5], [5, 7]] [(12, 16, 3)]"
    )
    assert (tmp_path / "mxnet.rec").read_bytes() == (tmp_path / "faces.rec").read_bytes()
    assert (tmp_path / "mxnet.idx").read_bytes() == (tmp_path / "faces.idx").read_bytes()
