"""Write the bad-input corpus of the reliability suite (docs/reliability.md, figure F-01).

Every case is crafted from a small valid dataset made here (nothing is stored as a blob): a
RecordIO set (``ds.rec``, ``ds.idx``, ``ds.crc32c``, ``ds.stoker.json``) of eight tiny JPEGs,
one of them split into a multi-part record, then damaged one way per *variant*; image files
for ``stoker pack`` and for the loader's folder source; insightface layouts; hostile
manifests for ``stoker unpack``. A *case* is one variant run through one entry point:

- ``read``: RecordIO's reader (``RecordIOReader(target, checksums=True)``, which checks an
  insightface layout as it opens) then ``read`` of every position and ``labels()``;
- ``read-nocrc``: the same without checksums (what the framing alone must catch);
- ``verify``: ``verify_records(target, checksums=True)`` must report a problem;
- ``loader``: ``stoker.Loader(target, workers=0)`` iterated over one epoch;
- ``cli-verify`` / ``cli-inspect`` / ``cli-unpack``: ``stoker.cli.main([...])``;
- ``pack``: the file is one of the inputs of a single ``stoker.pack`` run over ``pack_src``;
  it is handled when a row of the rejects file names it with a reason.

Each case says which file names its error message must contain (``names``: any one) and what
place it must name (``where``: regular expressions, any one: a byte offset, a line, a key, or
for a whole-file problem the field or size at fault). ``defect`` marks a case a known defect
still fails (the tests make it a strict xfail).

Use from the tests: ``cases = corpus_cases()`` (pure, no files), ``write_corpus(root)``.
As a script: ``python scripts/make_fault_corpus.py OUTDIR`` writes the corpus and
``OUTDIR/corpus.json`` describing every case.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import shutil
import struct
import sys
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

NAME = "ds"
N_RECORDS = 8
SPLIT_KEY = 5  # its IRHeader id holds the magic: written as parts with cflag 1, 3
SPLIT3_KEY = 6  # id holds the magic twice: parts with cflag 1, 2 (empty), 3
PLAIN_KEY = 2  # the record the single-record damages hit
MAGIC = 0xCED7230A
MAGIC_LE = struct.pack("<I", MAGIC)
OFFSET = r"byte offset \d+"
LINE = r"line \d+"
KEY = r"key \d+"
PLACE = [OFFSET, LINE, KEY]
SEED = 20261201


@dataclass
class Case:
    """One bad input run through one entry point (see the module docstring)."""

    id: str
    group: str  # B1, B3, B9 (faults.md section B)
    row: int  # the catalogue row
    variant: str  # the folder under the corpus root holding its files
    entry: str
    target: str  # path relative to the corpus root handed to the entry point
    names: list[str]  # the message must name one of these files
    where: list[str]  # ... and match one of these regular expressions
    note: str = ""
    defect: str | None = None
    extra: dict = field(default_factory=dict)


Builder = Callable[[Path], None]


# --------------------------------------------------------------------------- base data


def tiny_jpeg(seed: int, size: int = 16) -> bytes:
    """A small deterministic RGB JPEG."""
    from PIL import Image

    rng = random.Random(seed)
    im = Image.new("RGB", (size, size), (rng.randrange(256), rng.randrange(256), 80))
    for x in range(0, size, 2):
        im.putpixel((x, x), (rng.randrange(256), 0, rng.randrange(256)))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=80)
    return buf.getvalue()


def tiny_png(seed: int, size: int = 16) -> bytes:
    from PIL import Image

    im = Image.new("RGB", (size, size), (seed % 256, 40, 200))
    buf = io.BytesIO()
    im.save(buf, "PNG")
    return buf.getvalue()


def base_payloads(n: int = N_RECORDS, *, seed: int = 0) -> list[bytes]:
    """The dmlc payloads of the base set: IRHeader (label ``i % 2``, id ``i``) + a JPEG; record
    ``SPLIT_KEY`` carries the magic in its id (one split), ``SPLIT3_KEY`` twice (two)."""
    from stoker.formats.recordio import IRHeader, pack_header

    out = []
    for i in range(n):
        id_ = i
        if i == SPLIT_KEY:
            id_ = MAGIC
        elif i == SPLIT3_KEY:
            id_ = MAGIC | (MAGIC << 32)
        out.append(pack_header(IRHeader(0, float(i % 2), id_, 0), tiny_jpeg(seed * 100 + i)))
    return out


def write_set(folder: Path, payloads: list[bytes], *, name: str = NAME, manifest: bool = True):
    """``name.rec/.idx/.crc32c`` (+ ``name.stoker.json`` with classes a, b); returns ShardInfo."""
    from stoker.formats.recordio import RecordWriter, make_manifest, shard_entry, write_manifest

    folder.mkdir(parents=True, exist_ok=True)
    rec = folder / f"{name}.rec"
    w = RecordWriter(rec, checksums=True, overwrite=True)
    try:
        for k, p in enumerate(payloads):
            w.write(k, p)
    except BaseException:
        w.abort()
        raise
    info = w.commit()
    if manifest:
        mpath = folder / f"{name}.stoker.json"
        m = make_manifest([shard_entry(info, mpath)], classes={"a": 0, "b": 1})
        write_manifest(mpath, m)
    return info


def record_offsets(folder: Path, name: str = NAME) -> list[int]:
    text = (folder / f"{name}.idx").read_text()
    return [int(line.split("\t")[1]) for line in text.splitlines() if line]


def _ensure_base(root: Path) -> Path:
    base = root / "_base"
    if not (base / f"{NAME}.stoker.json").exists():
        write_set(base, base_payloads())
    return base


def _copy_base(root: Path, folder: Path, *, manifest: bool = True) -> None:
    base = _ensure_base(root)
    folder.mkdir(parents=True, exist_ok=True)
    for suffix in (".rec", ".idx", ".crc32c", ".stoker.json"):
        if suffix == ".stoker.json" and not manifest:
            continue
        shutil.copyfile(base / f"{NAME}{suffix}", folder / f"{NAME}{suffix}")


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _flip_bit(path: Path, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(bit // 8)
        b = f.read(1)[0]
        f.seek(bit // 8)
        f.write(bytes([b ^ (1 << (bit % 8))]))


# --------------------------------------------------------------------------- registry


class _Corpus:
    """Variants (folder -> builder) and the cases that run them."""

    def __init__(self) -> None:
        self.variants: dict[str, Builder] = {}
        self.cases: list[Case] = []

    def variant(self, name: str, build: Builder) -> None:
        assert name not in self.variants, name
        self.variants[name] = build

    def rec_damage(
        self,
        name: str,
        row: int,
        damage: Callable[[Path], None],
        *,
        entries: tuple[str, ...],
        manifest: bool = False,
        where: list[str] | None = None,
        names: list[str] | None = None,
        target: str = f"{NAME}.rec",
        note: str = "",
        defects: dict[str, str] | None = None,
        group: str = "B3",
    ) -> None:
        """A copy of the base set (without its manifest unless ``manifest``), ``damage``d."""

        def build(folder: Path, _damage=damage, _m=manifest) -> None:
            _copy_base(folder.parent.parent, folder, manifest=_m)
            _damage(folder)

        self.variant(f"{group}/{name}", build)
        for entry in entries:
            self.cases.append(
                Case(
                    id=f"{group}-{name}-{entry}",
                    group=group,
                    row=row,
                    variant=f"{group}/{name}",
                    entry=entry,
                    target=f"{group}/{name}/{target}",
                    names=names or [f"{NAME}.rec", f"{NAME}.idx"],
                    where=where or PLACE,
                    note=note,
                    defect=(defects or {}).get(entry),
                )
            )


# --------------------------------------------------------------------------- B3: .rec


def _truncate_at(fraction: float | None, k: int | None) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        rec = folder / f"{NAME}.rec"
        size = rec.stat().st_size
        new = size - k if k is not None else int(size * fraction)  # type: ignore[operator]
        os.truncate(rec, max(0, new))

    return damage


def _at_record(key: int, rel: int, data: bytes) -> Callable[[Path], None]:
    """Overwrite ``data`` at byte ``rel`` of the record with ``key`` (from its first byte)."""

    def damage(folder: Path) -> None:
        _patch(folder / f"{NAME}.rec", record_offsets(folder)[key] + rel, data)

    return damage


def _flip_record_bit(key: int, bit: int) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        _flip_bit(folder / f"{NAME}.rec", record_offsets(folder)[key] * 8 + bit)

    return damage


def _set_length(key: int, fn: Callable[[int, int], int]) -> Callable[[Path], None]:
    """Replace the ``lrec`` word of ``key``'s first part by ``fn(lrec, rec_size)``."""

    def damage(folder: Path) -> None:
        rec = folder / f"{NAME}.rec"
        off = record_offsets(folder)[key]
        data = rec.read_bytes()
        (lrec,) = struct.unpack_from("<I", data, off + 4)
        _patch(rec, off + 4, struct.pack("<I", fn(lrec, len(data)) & 0xFFFFFFFF))

    return damage


def _set_cflag(key: int, part: int, cflag: int) -> Callable[[Path], None]:
    """Set the cflag of part ``part`` (0-based) of the record ``key``."""

    def damage(folder: Path) -> None:
        rec = folder / f"{NAME}.rec"
        data = rec.read_bytes()
        pos = record_offsets(folder)[key]
        for _ in range(part):
            (lrec,) = struct.unpack_from("<I", data, pos + 4)
            pos += 8 + (((lrec & 0x1FFFFFFF) + 3) & ~3)
        (lrec,) = struct.unpack_from("<I", data, pos + 4)
        _patch(rec, pos + 4, struct.pack("<I", (cflag << 29) | (lrec & 0x1FFFFFFF)))

    return damage


def _rec_cases(c: _Corpus) -> None:
    both = ("read-nocrc", "verify")
    for j in range(40):  # row 26: cut anywhere in the file
        f = (j + 0.5) / 40
        extra = ("loader",) if j % 10 == 3 else ()
        c.rec_damage(f"trunc-at-{f:.4f}", 26, _truncate_at(f, None), entries=both + extra)
    for k in (1, 2, 3, 4, 5, 8):  # row 26: the last record's tail (and padding) cut
        c.rec_damage(f"trunc-tail-{k}", 26, _truncate_at(None, k), entries=both)
    c.rec_damage(
        "trunc-with-manifest",
        26,
        _truncate_at(0.5, None),
        entries=("read", "verify"),
        manifest=True,
        target=f"{NAME}.stoker.json",
        where=[r"\d+ bytes", r"truncated"],
        names=[f"{NAME}.rec"],
    )
    for bit in range(32):  # row 27: each bit of the magic
        extra = ("loader",) if bit in (0, 31) else ("cli-verify",) if bit == 7 else ()
        c.rec_damage(
            f"magic-bit-{bit:02d}",
            27,
            _flip_record_bit(PLAIN_KEY, bit),
            entries=both + extra,
            manifest=True,
        )
    lengths: list[tuple[str, Callable[[int, int], int], tuple[str, ...]]] = [
        ("len-max", lambda lr, s: 0x1FFFFFFF, both + ("loader",)),
        ("len-all-ones", lambda lr, s: 0xFFFFFFFF, both),
        ("len-file-size", lambda lr, s: s, both),
        ("len-2-28", lambda lr, s: 1 << 28, both),
        ("len-zero", lambda lr, s: 0, both),
        ("len-plus-4", lambda lr, s: lr + 4, ("read", "verify")),
        ("len-minus-4", lambda lr, s: lr - 4, ("read", "verify")),
    ]
    for name, fn, entries in lengths:  # row 28
        c.rec_damage(name, 28, _set_length(PLAIN_KEY, fn), entries=entries, manifest=True)
    flags = [  # row 34: IRHeader flag (payload byte 0 = record byte 8)
        ("flag-2-31", struct.pack("<I", 1 << 31), both),
        ("flag-all-ones", b"\xff\xff\xff\xff", both),
        ("flag-2-20", struct.pack("<I", 1 << 20), both),
        ("flag-1", struct.pack("<I", 1), ("read", "verify")),
        ("flag-3", struct.pack("<I", 3), ("read", "verify")),
    ]
    for name, data, entries in flags:
        c.rec_damage(name, 34, _at_record(PLAIN_KEY, 8, data), entries=entries, manifest=True)
    c.rec_damage(
        "flag-split-2-30",
        34,
        _at_record(SPLIT_KEY, 8, struct.pack("<I", 1 << 30)),
        entries=both,
        manifest=True,
    )
    chains = [  # row 35
        ("chain-first-0", SPLIT_KEY, 0, 0),
        ("chain-first-2", SPLIT_KEY, 0, 2),
        ("chain-first-3", SPLIT_KEY, 0, 3),
        ("chain-last-0", SPLIT_KEY, 1, 0),
        ("chain-last-1", SPLIT_KEY, 1, 1),
        ("chain-last-2", SPLIT_KEY, 1, 2),
        ("chain3-mid-0", SPLIT3_KEY, 1, 0),
        ("chain3-mid-1", SPLIT3_KEY, 1, 1),
        ("chain3-mid-3", SPLIT3_KEY, 1, 3),
        ("chain3-last-2", SPLIT3_KEY, 2, 2),
    ]
    for name, key, part, cflag in chains:
        c.rec_damage(name, 35, _set_cflag(key, part, cflag), entries=both, manifest=True)


# --------------------------------------------------------------------------- B3: .idx


def _idx_lines(folder: Path) -> list[str]:
    return (folder / f"{NAME}.idx").read_text().splitlines()


def _write_idx(folder: Path, lines: list[str] | bytes) -> None:
    data = lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode("utf-8")
    (folder / f"{NAME}.idx").write_bytes(data)


def _idx_line(template: str | bytes) -> Callable[[Path], None]:
    """Replace line 3 (key ``PLAIN_KEY``) by ``template`` ({off}, {size}, {end} filled in)."""

    def damage(folder: Path) -> None:
        lines = _idx_lines(folder)
        off = int(lines[PLAIN_KEY].split("\t")[1])
        size = (folder / f"{NAME}.rec").stat().st_size
        if isinstance(template, bytes):
            raw = [ln.encode() for ln in lines]
            raw[PLAIN_KEY] = template
            _write_idx(folder, b"\n".join(raw) + b"\n")
            return
        lines[PLAIN_KEY] = template.format(off=off, size=size, end=(size + 4) & ~3)
        _write_idx(folder, lines)

    return damage


IDX_LINES: list[tuple[str, str | bytes]] = [
    ("no-tab", "2{off}"),
    ("space", "2 {off}"),
    ("two-tabs", "2\t{off}\t9"),
    ("tab-only", "\t"),
    ("key-empty", "\t{off}"),
    ("off-empty", "2\t"),
    ("key-alpha", "two\t{off}"),
    ("off-alpha", "2\tsixty"),
    ("key-neg", "-2\t{off}"),
    ("off-neg", "2\t-{off}"),
    ("off-past-eof", "2\t{end}"),
    ("off-at-eof", "2\t{size}"),
    ("off-huge", "2\t9223372036854775808"),
    ("off-unaligned", "2\t{off}2"),
    ("off-float", "2\t{off}.0"),
    ("off-hex", "2\t0x{off}"),
    ("off-plus", "2\t+{off}"),
    ("off-digits", "2\t" + "9" * 40),
    ("key-digits", "9" * 40 + "\t{off}"),
    ("nul", "2\t{off}\x00"),
    ("utf8", "2\t{off}\u00e9"),
    ("latin1", b"2\t\xff\xfe"),
    ("key-float", "2.5\t{off}"),
]


def _shift_offset(key: int, delta: int) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        lines = _idx_lines(folder)
        k, off = lines[key].split("\t")
        lines[key] = f"{k}\t{int(off) + delta}"
        _write_idx(folder, lines)

    return damage


def _to_part(key: int, part: int) -> Callable[[Path], None]:
    """Point the ``.idx`` line of ``key`` at part ``part`` of its record."""

    def damage(folder: Path) -> None:
        data = (folder / f"{NAME}.rec").read_bytes()
        lines = _idx_lines(folder)
        pos = int(lines[key].split("\t")[1])
        for _ in range(part):
            (lrec,) = struct.unpack_from("<I", data, pos + 4)
            pos += 8 + (((lrec & 0x1FFFFFFF) + 3) & ~3)
        lines[key] = f"{key}\t{pos}"
        _write_idx(folder, lines)

    return damage


def _dup(kind: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        lines = _idx_lines(folder)
        if kind == "append":
            lines.append(lines[PLAIN_KEY])
        elif kind == "adjacent":
            lines.insert(PLAIN_KEY + 1, lines[PLAIN_KEY])
        else:  # the key of line 5 becomes 2, its offset stays
            lines[4] = f"{PLAIN_KEY}\t{lines[4].split(chr(9))[1]}"
        _write_idx(folder, lines)

    return damage


def _other_idx(folder: Path) -> None:
    other = folder / "_other"
    write_set(other, [p + b"\x00" * 52 for p in base_payloads(seed=1)], manifest=False)
    shutil.copyfile(other / f"{NAME}.idx", folder / f"{NAME}.idx")
    shutil.rmtree(other)


def _idx_cases(c: _Corpus) -> None:
    both = ("read-nocrc", "verify")
    idx = [f"{NAME}.idx", f"{NAME}.rec"]  # the .idx line may be named beside the .rec
    for j, (name, template) in enumerate(IDX_LINES):  # row 29
        extra = ("cli-verify",) if j % 6 == 0 else ("loader",) if j % 6 == 3 else ()
        c.rec_damage(
            f"idx-{name}", 29, _idx_line(template), entries=both + extra, names=idx, where=[LINE]
        )
    for delta in (4, 8, 12, 16, -4):  # row 30
        c.rec_damage(f"idx-mid-record{delta:+d}", 30, _shift_offset(3, delta), entries=both)
    c.rec_damage("idx-to-second-part", 30, _to_part(SPLIT_KEY, 1), entries=both)
    c.rec_damage("idx-to-middle-part", 30, _to_part(SPLIT3_KEY, 1), entries=both)
    c.rec_damage("idx-to-last-part", 30, _to_part(SPLIT3_KEY, 2), entries=both)
    for kind in ("append", "adjacent", "other-offset"):  # row 31
        c.rec_damage(
            f"idx-dup-{kind}",
            31,
            _dup(kind),
            entries=both + ("loader",),
            names=idx,
            where=[r"line \d+.*line \d+"],
        )
    c.rec_damage("idx-from-other-rec", 32, _other_idx, entries=both)  # row 32
    c.rec_damage(
        "idx-from-other-rec-manifest",
        32,
        _other_idx,
        entries=("read", "verify", "cli-verify"),
        manifest=True,
        target=f"{NAME}.stoker.json",
        names=idx + [f"{NAME}.stoker.json"],
        where=[r"idx does not match rec"],
    )


# --------------------------------------------------------------------------- B3: .crc32c, empty


def _crc(kind: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        crc = folder / f"{NAME}.crc32c"
        data = bytearray(crc.read_bytes())
        if kind == "short":
            data = data[:-4]
        elif kind == "long":
            data += b"\x00\x00\x00\x00"
        elif kind == "empty":
            data = bytearray()
        elif kind == "odd":
            data = data[:-1]
        elif kind == "flip":
            data[4 * 3] ^= 0x10
        elif kind == "swap":
            data[4:8], data[8:12] = data[8:12], data[4:8]
        elif kind == "missing":
            crc.unlink()
            return
        crc.write_bytes(bytes(data))

    return damage


def _empty(kind: str) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        for p in folder.iterdir():
            p.unlink()
        (folder / f"{NAME}.rec").write_bytes(b"")
        if kind == "with-idx":
            (folder / f"{NAME}.idx").write_bytes(b"")
        elif kind == "blank-idx":
            (folder / f"{NAME}.idx").write_bytes(b"\n\n\r\n")
        elif kind == "manifest":
            from stoker.formats.recordio import make_manifest, write_manifest

            write_manifest(folder / f"{NAME}.stoker.json", make_manifest([]))

    return damage


def _crc_empty_cases(c: _Corpus) -> None:
    crc = [f"{NAME}.crc32c"]
    for kind in ("short", "long", "empty", "odd"):  # the side-car's size (format.md §3)
        c.rec_damage(
            f"crc-{kind}",
            33,
            _crc(kind),
            entries=("read", "verify"),
            names=crc,
            where=[r"\d+ bytes", r"\d+ records"],
        )
    for kind in ("flip", "swap"):  # a stored CRC that does not match
        c.rec_damage(f"crc-{kind}", 33, _crc(kind), entries=("read", "verify", "cli-verify"))
    c.rec_damage(
        "crc-missing",
        33,
        _crc("missing"),
        entries=("read", "verify", "cli-verify"),
        manifest=True,
        target=f"{NAME}.stoker.json",
        names=crc,
        where=[r"does not exist", r"missing", r"no checksum"],
    )
    for kind in ("rec-only", "with-idx", "blank-idx", "manifest"):  # row 36
        target = f"{NAME}.stoker.json" if kind == "manifest" else f"{NAME}.rec"
        c.rec_damage(
            f"empty-{kind}",
            36,
            _empty(kind),
            entries=("loader",),
            target=target,
            names=[f"{NAME}.rec", f"{NAME}.stoker.json", f"{NAME}.idx"],
            where=[r"\b0 records", r"no records", r"empty"],
        )


# --------------------------------------------------------------------------- B3/B9: manifests


class _Sentinel:
    """Pickled into a fake manifest: unpickling it would create ``path`` (it must never be)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _manifest_edit(edit: Callable[[dict, Path], bytes | dict]) -> Callable[[Path], None]:
    """Replace the manifest by ``edit(manifest, folder)`` (a dict is dumped as JSON)."""

    def damage(folder: Path) -> None:
        mpath = folder / f"{NAME}.stoker.json"
        out = edit(json.loads(mpath.read_text()), folder)
        if isinstance(out, dict):
            out = json.dumps(out).encode("ascii")
        mpath.write_bytes(out)

    return damage


def _shard(**kw: object) -> Callable[[dict, Path], dict]:
    def edit(m: dict, folder: Path) -> dict:
        m["shards"][0].update(kw)
        return m

    return edit


def _files(**kw: object) -> Callable[[dict, Path], dict]:
    def edit(m: dict, folder: Path) -> dict:
        m["shards"][0]["files"].update(kw)
        return m

    return edit


def _sha(value: object) -> Callable[[dict, Path], dict]:
    def edit(m: dict, folder: Path) -> dict:
        m["shards"][0]["checksums"]["index.sha256"] = value
        return m

    return edit


def _top(**kw: object) -> Callable[[dict, Path], dict]:
    def edit(m: dict, folder: Path) -> dict:
        m.update(kw)
        return m

    return edit


def _raw(data: bytes) -> Callable[[dict, Path], bytes]:
    return lambda m, folder: data


def _twice(m: dict, folder: Path) -> dict:
    m["shards"] = [m["shards"][0], dict(m["shards"][0])]
    m["records"] *= 2
    return m


def _pickle(m: dict, folder: Path) -> bytes:
    import pickle

    return pickle.dumps(_Sentinel(str(folder / "UNPICKLED")), protocol=2)


def _oversize(m: dict, folder: Path) -> bytes:
    return json.dumps(m).encode() + b" " * ((64 << 20) + 16)


def _dir_shard(m: dict, folder: Path) -> dict:
    (folder / "sub").mkdir(exist_ok=True)
    m["shards"][0]["files"]["data"] = "sub"
    return m


def _drop_key(key: str) -> Callable[[dict, Path], dict]:
    def edit(m: dict, folder: Path) -> dict:
        del m[key]
        return m

    return edit


SHARD = r"shards\[0\]"
DATA = SHARD + r"\.files\.data"
MANIFEST_EDITS: list[tuple[str, Callable[[dict, Path], bytes | dict], list[str]]] = [
    ("shard-twice", _twice, [r"shards\[1\]", "twice", "more than once", "duplicate"]),
    ("records-total", _top(records=9), [r"\brecords\b"]),
    ("records-shard", lambda m, f: {**_shard(records=7)(m, f), "records": 7}, [r"records"]),
    ("rec-bytes", lambda m, f: _shard(bytes=m["shards"][0]["bytes"] + 4)(m, f), [r"bytes"]),
    ("idx-sha", _sha("0" * 64), [r"idx does not match rec", "sha256"]),
    ("rec-dot", _files(data="."), [DATA]),
    ("rec-dotdot", _files(data=".."), [DATA]),
    ("rec-parent", _files(data="../ds.rec"), [DATA]),
    ("rec-deep-parent", _files(data="a/../../ds.rec"), [DATA]),
    ("rec-abs", _files(data="/etc/passwd"), [DATA]),
    ("rec-backslash", _files(data="..\\ds.rec"), [DATA]),
    ("rec-nul", _files(data="ds\x00.rec"), [DATA]),
    ("rec-empty", _files(data=""), [DATA]),
    ("rec-int", _files(data=5), [DATA]),
    ("rec-dir", _dir_shard, [DATA, r"files\.data", r"sub"]),
    ("idx-dotdot", _files(index="../ds.idx"), [SHARD + r"\.files\.index"]),
    ("crc-dotdot", _files(crc="../ds.crc32c"), [SHARD + r"\.files\.crc"]),
    ("records-neg", _shard(records=-1), [SHARD + r"\.records"]),
    ("records-bool", _shard(records=True), [SHARD + r"\.records"]),
    ("records-float", _shard(records=8.0), [SHARD + r"\.records"]),
    ("rec-bytes-str", _shard(bytes="12"), [SHARD + r"\.bytes"]),
    (
        "sha-upper",
        lambda m, f: _sha(m["shards"][0]["checksums"]["index.sha256"].upper())(m, f),
        [SHARD + r"\.checksums\.index\.sha256"],
    ),
    ("sha-missing", _sha(None), [SHARD + r"\.checksums\.index\.sha256"]),
    ("format", _top(format="mxnet"), ["format"]),
    ("version-3", _top(version=3), ["version"]),
    ("version-true", _top(version=True), ["version"]),
    ("version-missing", _drop_key("version"), ["version"]),
    ("shards-dict", _top(shards={"files": {"data": "ds.rec"}}), ["shards"]),
    ("shards-missing", _drop_key("shards"), ["shards"]),
    ("shard-str", _top(shards=["ds.rec"]), [SHARD]),
    ("classes-list", _top(classes=["a", "b"]), ["classes"]),
    ("classes-gap", _top(classes={"a": 0, "b": 2}), ["class ids"]),
    ("classes-dup-id", _top(classes={"a": 0, "b": 0}), ["class ids"]),
    ("classes-neg", _top(classes={"a": -1}), [r"classes\['a'\]"]),
    ("pack-list", _top(pack=[]), ["pack"]),
    (
        "nan-records",
        lambda m, f: json.dumps(m).replace('"records": 8,', '"records": NaN,', 1).encode(),
        ["records"],
    ),
    (
        "huge-int",
        lambda m, f: (
            json.dumps(m).replace('"records": 8,', '"records": 1' + "0" * 5000 + ",", 1).encode()
        ),
        ["digits", "records"],
    ),
    (
        "dup-json-key",
        lambda m, f: (
            json.dumps(m).replace('"records": 8,', '"records": 8, "records": 9,', 1).encode()
        ),
        ["records"],
    ),
    ("top-array", _raw(b"[]"), ["JSON object"]),
    ("top-string", _raw(b'"ds.rec"'), ["JSON object"]),
    ("empty-file", _raw(b""), [LINE]),
    ("truncated-json", lambda m, f: json.dumps(m).encode()[:40], [LINE]),
    ("bom", lambda m, f: b"\xef\xbb\xbf" + json.dumps(m).encode(), [LINE, "BOM"]),
    ("utf16", lambda m, f: json.dumps(m).encode("utf-16"), [r"byte \d+"]),
    (
        "latin1-name",
        lambda m, f: json.dumps(m).encode().replace(b'"a"', b'"\xe9"', 1),
        [r"byte \d+"],
    ),
    ("pickle", _pickle, [r"byte \d+", "JSON"]),
    ("zip", _raw(b"PK\x03\x04" + bytes(range(256)) * 4), [r"byte \d+", LINE]),
    (
        "binary",
        _raw(bytes(random.Random(SEED).getrandbits(8) for _ in range(512))),
        [r"byte \d+", LINE],
    ),
    ("deep-array", _raw(b"[" * 100000 + b"]" * 100000), ["nested", "deep"]),
    ("deep-object", _raw(b'{"a":' * 50000 + b"1" + b"}" * 50000), ["nested", "deep"]),
    ("oversize", _oversize, [r"\d+-byte cap"]),
]


#: manifest checks whose finding names the shard's file it is about (verify names that file)
FILE_CHECKS = ("records-shard", "rec-bytes", "idx-sha", "rec-dir")
SHARD_FILES = [f"{NAME}.rec", f"{NAME}.idx", "sub"]


def _manifest_cases(c: _Corpus) -> None:
    for j, (name, edit, where) in enumerate(MANIFEST_EDITS):  # rows 32, 78, 82 and format.md §4
        extra = ("cli-inspect",) if j % 4 == 0 else ("loader",) if j % 4 == 2 else ()
        if name == "shard-twice":
            extra = ("cli-inspect", "loader")
        c.rec_damage(
            f"manifest-{name}",
            82
            if name in ("oversize", "deep-array", "deep-object")
            else 78
            if name == "pickle"
            else 32,
            _manifest_edit(edit),
            entries=("read", "verify") + extra,
            manifest=True,
            target=f"{NAME}.stoker.json",
            where=where,
            names=[f"{NAME}.stoker.json"] + (SHARD_FILES if name in FILE_CHECKS else []),
            group="B9" if name in ("pickle", "oversize", "deep-array", "deep-object") else "B3",
        )


HOSTILE_CLASSES = [
    "../x",
    "../../x",
    "a/b",
    "/abs",
    "x\x00y",
    "..",
    ".",
    "",
    "a\\b",
    "../../../../tmp/stoker-evil",
]


def _unpack_cases(c: _Corpus) -> None:
    for j, bad in enumerate(HOSTILE_CLASSES):  # row 80
        name = f"unpack-class-{j}"
        c.rec_damage(
            name,
            80,
            _manifest_edit(_top(classes={bad: 0, "ok": 1})),
            entries=(),
            manifest=True,
            group="B9",
        )
        targets = [f"{NAME}.stoker.json", f"{NAME}.rec"] if j < 3 else [f"{NAME}.stoker.json"]
        for target in targets:
            how = "manifest" if target.endswith(".json") else "rec"
            c.cases.append(
                Case(
                    id=f"B9-{name}-{how}-cli-unpack",
                    group="B9",
                    row=80,
                    variant=f"B9/{name}",
                    entry="cli-unpack",
                    target=f"B9/{name}/{target}",
                    names=[target],
                    where=[re.escape(repr(bad))],
                    extra={"class": bad},
                )
            )


# --------------------------------------------------------------------------- insightface


def _insightface(kind: str) -> Callable[[Path], None]:
    """An insightface-layout set (header key 0, images 1..4, identities 5, 6) damaged one way."""

    def build(folder: Path) -> None:
        from stoker.formats.recordio import IRHeader, pack_header

        for p in folder.iterdir():
            p.unlink()
        a, b = (5, 20) if kind == "b-too-big" else (5, 7)
        ranges: list[list[float]] = [[1, 3], [3, 5]]
        ranges = {
            "range-low": [[0, 3], [3, 5]],
            "range-high": [[1, 3], [3, 9]],
            "range-reversed": [[3, 1], [3, 5]],
            "non-integer": [[1.5, 3], [3, 5]],
        }.get(kind, ranges)
        payloads = [pack_header(IRHeader(0, [float(a), float(b)], 0, 0), b"")]
        payloads += [
            pack_header(IRHeader(0, float(i // 3), i, 0), tiny_jpeg(i)) for i in range(1, a)
        ]
        for j, r in enumerate(ranges):
            label = 7.0 if (kind == "one-label" and j == 1) else [float(x) for x in r]
            payloads.append(pack_header(IRHeader(0, label, a + j, 0), b""))
        write_set(folder, payloads, manifest=False)
        if kind == "missing-key":
            lines = _idx_lines(folder)
            del lines[3]
            _write_idx(folder, lines)
            crc = (folder / f"{NAME}.crc32c").read_bytes()
            (folder / f"{NAME}.crc32c").write_bytes(crc[:12] + crc[16:])

    return build


def _insightface_cases(c: _Corpus) -> None:
    kinds = [
        "b-too-big",
        "missing-key",
        "range-low",
        "range-high",
        "range-reversed",
        "one-label",
        "non-integer",
    ]
    for kind in kinds:
        c.rec_damage(f"insightface-{kind}", 5, _insightface(kind), entries=("read", "loader"))


# --------------------------------------------------------------------------- B1: image files


def noise_image(fmt: str, size: int = 64, seed: int = 0, **save: object) -> bytes:
    """A ``size``×``size`` noise image (entropy data fills most of the file)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    im = Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
    buf = io.BytesIO()
    im.save(buf, fmt, **save)
    return buf.getvalue()


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_with_size(w: int, h: int) -> bytes:
    """A PNG whose IHDR declares ``w``×``h`` RGB with one tiny IDAT (a bomb header)."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + png_chunk(b"IEND", b"")
    )


def png_with_chunk(kind: bytes, data: bytes) -> bytes:
    """The tiny PNG with one extra chunk right after IHDR."""
    png = tiny_png(1)
    return png[:33] + png_chunk(kind, data) + png[33:]


def jpeg_with_size(w: int, h: int) -> bytes:
    """The tiny JPEG with its SOF0 width and height replaced."""
    data = bytearray(tiny_jpeg(3))
    i = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, i + 5, h, w)
    return bytes(data)


def gif_with_size(w: int, h: int) -> bytes:
    return (
        b"GIF89a"
        + struct.pack("<HHBBB", w, h, 0, 0, 0)
        + b","
        + struct.pack("<HHHHB", 0, 0, w, h, 0)
        + b"\x02\x02\x44\x01\x00;"
    )


def bmp_with_size(w: int, h: int) -> bytes:
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + 40 + 64, 0, 0, 54) + info + b"\x00" * 64


def jpeg_many_scans(scans: int = 3000) -> bytes:
    """A progressive JPEG whose last scan is repeated ``scans`` times."""
    data = noise_image("JPEG", 32, 5, progressive=True, quality=90)
    last = data.rindex(b"\xff\xda")
    body = data[last:-2]
    return data[:last] + body * scans + b"\xff\xd9"


def _cut(data: bytes, f: float) -> bytes:
    return data[: int(len(data) * f)]


def _entropy_flips(seed: int) -> bytes:
    """Noise JPEG with 16 seeded bytes after SOS replaced (faults.md row 8)."""
    data = bytearray(noise_image("JPEG", 64, 7))
    start = data.index(b"\xff\xda") + 14
    rng = random.Random(seed)
    for _ in range(16):
        data[rng.randrange(start, len(data) - 2)] = rng.randrange(256)
    return bytes(data)


def bad_images() -> list[tuple[str, int, Callable[[], bytes], dict]]:
    """``(file name, catalogue row, make bytes, options)`` of every bad image input.

    Options: ``packed_ok`` (a decodable result is also fine: row 8), ``loader`` (also a case
    for the loader's folder source), ``bomb`` (the loader case runs under a memory limit)."""
    jpg = lambda: noise_image("JPEG", 64, 1)  # noqa: E731
    png = lambda: noise_image("PNG", 64, 2)  # noqa: E731
    out: list[tuple[str, int, Callable[[], bytes], dict]] = [
        ("empty.jpg", 1, lambda: b"", {"loader": True}),
        ("empty.png", 1, lambda: b"", {}),
        ("text.jpg", 3, lambda: b"hello, not an image\n" * 4, {"loader": True}),
        ("html.png", 3, lambda: b"<html><body>404</body></html>", {}),
        ("zip.jpeg", 3, lambda: b"PK\x03\x04" + bytes(200), {}),
        ("elf.jpg", 3, lambda: b"\x7fELF\x02\x01\x01" + bytes(120), {}),
        ("zeros.png", 3, lambda: bytes(1000), {"loader": True}),
        ("magic-only.jpg", 7, lambda: b"\xff\xd8\xff", {}),
        ("png-sig-only.png", 7, lambda: b"\x89PNG\r\n\x1a\n", {}),
        ("webp-junk.webp", 3, lambda: b"RIFF\x20\x00\x00\x00WEBPVP8 " + bytes(24), {}),
        ("tiff-junk.tif", 3, lambda: b"II*\x00" + bytes(60), {}),
        ("gif-cut.gif", 7, lambda: _cut(noise_image("GIF", 32, 3), 0.5), {}),
        ("bmp-cut.bmp", 7, lambda: _cut(noise_image("BMP", 32, 4), 0.5), {}),
        ("png-bad-crc.png", 8, lambda: _flip_at(png(), 60), {"loader": True}),
        ("png-zero-size.png", 9, lambda: png_with_size(0, 0), {}),
        ("jpeg-zero-height.jpg", 9, lambda: jpeg_with_size(16, 0), {}),
        ("bomb-30000.png", 9, lambda: png_with_size(30000, 30000), {"loader": True, "bomb": True}),
        ("bomb-10000.png", 9, lambda: png_with_size(10000, 10000), {}),
        ("bomb-wide.png", 9, lambda: png_with_size(100_000_000, 1), {}),
        ("bomb-30000.jpg", 9, lambda: jpeg_with_size(30000, 30000), {"loader": True, "bomb": True}),
        ("bomb-65535.jpg", 9, lambda: jpeg_with_size(65535, 65535), {}),
        ("bomb-65535.gif", 9, lambda: gif_with_size(65535, 65535), {}),
        ("bomb-30000.bmp", 9, lambda: bmp_with_size(30000, 30000), {"loader": True, "bomb": True}),
        (
            "ztxt-huge.png",
            10,
            lambda: png_with_chunk(b"zTXt", b"c\x00\x00" + zlib.compress(b"a" * (16 << 20))),
            {},
        ),
        (
            "itxt-huge.png",
            10,
            lambda: png_with_chunk(
                b"iTXt", b"c\x00\x01\x00\x00\x00" + zlib.compress(b"a" * (16 << 20))
            ),
            {},
        ),
        (
            "iccp-huge.png",
            10,
            lambda: png_with_chunk(b"iCCP", b"icc\x00\x00" + zlib.compress(bytes(16 << 20))),
            {},
        ),
        ("many-scans.jpg", 10, jpeg_many_scans, {"packed_ok": True}),
    ]
    for f in (0.1, 0.25, 0.5, 0.75, 0.9):
        out.append(
            (f"cut-{int(f * 100):02d}.jpg", 7, lambda f=f: _cut(jpg(), f), {"loader": f == 0.5})
        )
        out.append(
            (f"cut-{int(f * 100):02d}.png", 7, lambda f=f: _cut(png(), f), {"loader": f == 0.5})
        )
    for s in range(8):
        out.append((f"entropy-{s}.jpg", 8, lambda s=s: _entropy_flips(s), {"packed_ok": True}))
    return out


def _flip_at(data: bytes, i: int) -> bytes:
    b = bytearray(data)
    b[i] ^= 0xFF
    return bytes(b)


def _pack_src(folder: Path) -> None:
    (folder / "cls").mkdir(parents=True, exist_ok=True)
    (folder / "ok").mkdir(exist_ok=True)
    (folder / "ok" / "good.jpg").write_bytes(tiny_jpeg(9))
    for name, _row, make, _opts in bad_images():
        (folder / "cls" / name).write_bytes(make())


def _folder_with(name: str, make: Callable[[], bytes]) -> Callable[[Path], None]:
    def build(folder: Path) -> None:
        (folder / "cls").mkdir(parents=True, exist_ok=True)
        (folder / "cls" / "0-good.jpg").write_bytes(tiny_jpeg(9))
        (folder / "cls" / name).write_bytes(make())

    return build


def _image_cases(c: _Corpus) -> None:
    c.variant("B1/pack_src", _pack_src)
    for name, row, make, opts in bad_images():
        c.cases.append(
            Case(
                id=f"B1-{name}-pack",
                group="B1",
                row=row,
                variant="B1/pack_src",
                entry="pack",
                target="B1/pack_src",
                names=[name],
                where=[r"\t[a-z_]+\t"],
                extra={"file": f"cls/{name}", **opts},
            )
        )
        if opts.get("loader"):
            v = f"B1/folder-{name}"
            c.variant(v, _folder_with(name, make))
            c.cases.append(
                Case(
                    id=f"B1-{name}-loader-folder",
                    group="B1",
                    row=row,
                    variant=v,
                    entry="loader",
                    target=v,
                    names=[name],
                    where=[KEY],
                    extra=opts,
                )
            )


# --------------------------------------------------------------------------- the corpus


def _corpus() -> _Corpus:
    c = _Corpus()
    for add in (
        _rec_cases,
        _idx_cases,
        _crc_empty_cases,
        _manifest_cases,
        _unpack_cases,
        _insightface_cases,
        _image_cases,
    ):
        add(c)
    return c


def corpus_cases() -> list[Case]:
    """Every case (no files are written)."""
    return _corpus().cases


def write_corpus(root: str | os.PathLike[str], variants: set[str] | None = None) -> list[Case]:
    """Write every variant (or those named) under ``root``; returns the cases."""
    rootp = Path(root)
    c = _corpus()
    rootp.mkdir(parents=True, exist_ok=True)
    _ensure_base(rootp)
    for name, build in c.variants.items():
        if variants is not None and name not in variants:
            continue
        folder = rootp / name
        folder.mkdir(parents=True, exist_ok=True)
        build(folder)
    return c.cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", help="folder to write the corpus into (created)")
    args = ap.parse_args(argv)
    cases = write_corpus(args.outdir)
    with open(os.path.join(args.outdir, "corpus.json"), "w") as f:
        json.dump({"seed": SEED, "cases": [asdict(k) for k in cases]}, f, indent=1)
    print(f"{len(cases)} cases written under {args.outdir} (corpus.json describes them)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    sys.exit(main())
