"""Bad tar input (faults.md B3/B9): each is a clear error naming the file and the byte offset
when the reader opens it, and a failed ``verify``; nothing is ever written outside the
temporary folder, and no header's word is believed before it is checked."""

from __future__ import annotations

import io
import os
import random
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from _wds_util import end_of_archive, hand_header, hand_member, jpeg

from stoker._core.errors import CorruptRecordError, StokerFormatError
from stoker.formats.wds import open_reader, verify


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))


def good_members() -> list[bytes]:
    return [
        hand_member(b"a.jpg", jpeg(0)),
        hand_member(b"a.cls", b"1"),
        hand_member(b"b.jpg", jpeg(1)),
        hand_member(b"b.cls", b"2"),
    ]


def offsets(members: list[bytes]) -> list[int]:
    out, pos = [], 0
    for m in members:
        out.append(pos)
        pos += len(m)
    return out


def refused(path: Path, match: str, offset: int | None) -> CorruptRecordError:
    """Opening ``path`` fails naming it and ``offset``; verify reports the same offset."""
    with pytest.raises(CorruptRecordError, match=match) as info:
        r = open_reader(path)
        try:
            len(r)
        finally:
            r.close()
    err = info.value
    assert err.path == str(path)
    assert str(path) in str(err)
    if offset is not None:
        assert err.offset == offset
        assert f"byte offset {offset}" in str(err)
    report = verify(path)
    assert not report.ok
    if offset is not None:
        assert offset in [p.offset for p in report.problems], report.problems
    return err


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_member_cut_short(tmp_path):
    members = good_members()
    whole = b"".join(members)
    cut = offsets(members)[2] + 512 + 100  # inside b.jpg's data
    p = write(tmp_path, "cut.tar", whole[:cut])
    err = refused(p, "b.jpg.*claims .* bytes .* cut short", offsets(members)[2])
    assert "file ends at" in str(err)
    assert len(verify(p).problems) == 1  # the break itself, no follow-on findings


def test_file_cut_inside_a_header(tmp_path):
    members = good_members()
    p = write(tmp_path, "cuth.tar", b"".join(members)[: offsets(members)[3] + 200])
    refused(p, "ends 200 bytes into a 512-byte header", offsets(members)[3])


def test_missing_end_of_archive_marker(tmp_path):
    members = good_members()
    p = write(tmp_path, "noend.tar", b"".join(members))
    refused(p, "no end-of-archive marker", len(b"".join(members)))


def test_bad_header_checksum(tmp_path):
    members = good_members()
    bad = bytearray(members[2])
    bad[3] ^= 0x20  # "b.jpg" -> "b.jPg": the stored checksum no longer fits
    members[2] = bytes(bad)
    p = write(tmp_path, "sum.tar", b"".join(members) + end_of_archive())
    refused(p, "header checksum mismatch", offsets(members)[2])


def test_not_a_tar_at_all(tmp_path):
    p = write(tmp_path, "junk.tar", os.urandom(4096))
    refused(p, "checksum|not an octal number", 0)


@pytest.mark.parametrize(
    "size_field",
    [
        f"{8**11 - 1:011o}".encode() + b"\x00",  # 8 GiB in octal
        b"\x80" + (1 << 60).to_bytes(11, "big"),  # GNU base-256, 2**60 bytes
    ],
    ids=["octal", "base256"],
)
def test_size_field_past_the_end_is_refused_without_allocating(tmp_path, size_field):
    members = good_members()
    members[2] = hand_header(b"b.jpg", 0, size_field=size_field) + jpeg(1)
    p = write(tmp_path, "huge.tar", b"".join(members) + end_of_archive())
    tracemalloc.start()
    try:
        refused(p, "claims .* bytes .* corrupt", offsets(members)[2])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_negative_base256_size(tmp_path):
    members = good_members()
    members[0] = hand_header(b"a.jpg", 0, size_field=b"\xff" * 12)
    p = write(tmp_path, "neg.tar", b"".join(members) + end_of_archive())
    refused(p, "negative", 0)


def _tar_with(tmp_path: Path, name: str, *infos: tuple[tarfile.TarInfo, bytes]) -> Path:
    p = tmp_path / name
    with tarfile.open(p, "w", format=tarfile.GNU_FORMAT) as t:
        for ti, data in infos:
            ti.size = len(data) if ti.isreg() else 0
            t.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return p


def _reg(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


@pytest.mark.parametrize("name", ["../evil.jpg", "a/../../evil.jpg", "/tmp/evil.jpg"])
def test_unsafe_names_are_refused_and_nothing_is_written(tmp_path, name):
    work = tmp_path / "work"
    work.mkdir()
    p = _tar_with(work, "evil.tar", _reg("ok.jpg", jpeg(0)), _reg(name, jpeg(1)))
    before = set(tmp_path.rglob("*")) | set(Path("/tmp").glob("evil*"))
    second = 512 + len(jpeg(0)) + (-len(jpeg(0)) % 512)
    err = refused(p, "absolute path|holds '\\.\\.'", second)
    assert "evil.jpg" in str(err)
    after = set(tmp_path.rglob("*")) | set(Path("/tmp").glob("evil*"))
    assert {q for q in after - before if "cache" not in q.parts} == set()


@pytest.mark.parametrize(
    ("kind", "flag"),
    [
        ("symbolic link", tarfile.SYMTYPE),
        ("hard link", tarfile.LNKTYPE),
        ("FIFO", tarfile.FIFOTYPE),
        ("character device", tarfile.CHRTYPE),
        ("block device", tarfile.BLKTYPE),
    ],
)
def test_links_devices_and_fifos_are_refused(tmp_path, kind, flag):
    link = tarfile.TarInfo("a.png")
    link.type = flag
    link.linkname = "/etc/passwd" if flag in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
    p = _tar_with(tmp_path, "link.tar", _reg("a.jpg", jpeg(0)), (link, b""), _reg("a.cls", b"0"))
    start = 512 + len(jpeg(0)) + (-len(jpeg(0)) % 512)
    err = refused(p, f"{kind} member 'a.png'", start)
    if link.linkname:
        assert "/etc/passwd" in str(err)


def test_nul_in_a_pax_path_is_refused(tmp_path):
    body = b" path=x\x00y.jpg\n"
    record = f"{len(body) + 2}".encode() + body  # two digits of length
    assert len(record) == int(record.split(b" ")[0])
    pax = hand_header(b"PaxHeader", len(record), typeflag=b"x") + record + bytes(-len(record) % 512)
    data = pax + hand_member(b"ignored.jpg", jpeg(0)) + end_of_archive()
    p = write(tmp_path, "nul.tar", data)
    refused(p, "NUL byte", 0)


def test_a_key_seen_again_later_names_both_offsets(tmp_path):
    members = [
        hand_member(b"a.jpg", jpeg(0)),
        hand_member(b"b.jpg", jpeg(1)),
        hand_member(b"a.txt", b"late caption"),
    ]
    p = write(tmp_path, "again.tar", b"".join(members) + end_of_archive())
    err = refused(p, "appears again", offsets(members)[2])
    assert f"starts at byte offset {offsets(members)[0]}" in str(err)


@pytest.mark.parametrize(
    ("members", "match"),
    [
        ([hand_member(b"a.txt", b"only a caption")], "no image member"),
        ([hand_member(b"a.jpg", jpeg(0)), hand_member(b"a.png", jpeg(0))], "2 images"),
        ([hand_member(b"a.jpg", jpeg(0)), hand_member(b"a.JPG", jpeg(0))], "two '.jpg' members"),
        ([hand_member(b"a.jpg", jpeg(0)), hand_member(b"a.cls", b"seven")], "not a decimal"),
        ([hand_member(b"a.jpg", jpeg(0)), hand_member(b"a.cls", b"1" * 100)], "not a decimal"),
        (
            [
                hand_member(b"a.jpg", jpeg(0)),
                hand_member(b"a.cls", b"1"),
                hand_member(b"b.jpg", jpeg(1)),
            ],
            "no .cls while others have one",
        ),
    ],
    ids=["no-image", "two-images", "same-suffix-twice", "bad-cls", "long-cls", "mixed-labels"],
)
def test_bad_samples(tmp_path, members, match):
    p = write(tmp_path, "bad.tar", b"".join(members) + end_of_archive())
    refused(p, match, None)


def test_empty_image_and_bad_caption_fail_at_read_and_in_verify(tmp_path):
    members = [
        hand_member(b"a.jpg", b""),
        hand_member(b"b.jpg", jpeg(1)),
        hand_member(b"b.txt", b"caf\xe9"),  # latin-1, not UTF-8
    ]
    p = write(tmp_path, "read.tar", b"".join(members) + end_of_archive())
    with open_reader(p) as r:
        f = r.reader(None, ("txt",))
        with pytest.raises(CorruptRecordError, match="image member is empty") as e1:
            f(0)
        assert e1.value.offset == 512
        with pytest.raises(CorruptRecordError, match="'.txt' is not UTF-8") as e2:
            f(1)
        assert e2.value.offset == offsets(members)[2] + 512 + 3
        assert "'b'" in str(e2.value)
    report = verify(p)
    assert sorted(q.offset for q in report.problems) == [512, offsets(members)[2] + 512 + 3]


def test_verify_decodes_when_asked(tmp_path):
    members = [hand_member(b"a.jpg", b"\xff\xd8\xff not really a jpeg")]
    p = write(tmp_path, "dec.tar", b"".join(members) + end_of_archive())
    assert verify(p).ok

    def decode(buf: bytes) -> None:
        raise ValueError("no image here")

    report = verify(p, decode=decode)
    assert (
        not report.ok and "does not decode: ValueError: no image here" in report.problems[0].reason
    )


def test_mutated_tars_give_the_right_samples_or_a_format_error(tmp_path):
    """A seeded mutator (byte changes, cuts, insertions) over a hand-built and a pax tar:
    every outcome is samples read or a ``StokerFormatError``; verify never raises."""
    base = b"".join(
        [
            hand_member(b"a.jpg", jpeg(0)),
            hand_member(b"a.cls", b"1"),
            hand_member(b"a.txt", b"hi"),
            hand_member(b"b.jpg", jpeg(1)),
            hand_member(b"b.cls", b"2"),
        ]
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in (("c\u00e9/x.jpg", jpeg(2)), ("c\u00e9/x.cls", b"3")):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))
    bases = [base + end_of_archive(), buf.getvalue()]
    rng = random.Random(1234)
    p = tmp_path / "m.tar"
    outcomes = {"read": 0, "refused": 0}
    for _ in range(300):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(len(data))
            op = rng.random()
            if op < 0.6:
                data[pos] = rng.randrange(256)
            elif op < 0.8:
                del data[pos:]
            else:
                data[pos:pos] = rng.randbytes(rng.randint(1, 600))
        p.write_bytes(bytes(data))
        try:
            with open_reader(p, cache=False) as r:
                f = r.reader(None, tuple(r.schema.stored))
                for i in range(len(r)):
                    f(i)
                    r.describe(i)
                r.labels()
            outcomes["read"] += 1
        except StokerFormatError:
            outcomes["refused"] += 1
        verify(p)
    assert outcomes["read"] > 0 and outcomes["refused"] > 0
