"""Whole-file verification of RecordIO shards (what ``stoker verify`` runs).

:func:`verify_records` walks every byte of the ``.rec`` once, in order, and reports:

- framing problems (bad magic, truncation, broken multi-part chains, bad ``IRHeader``);
  after one it resynchronises at the next aligned magic (the writer guarantees the magic
  never appears at an aligned offset inside a payload) and keeps going;
- the ``.idx`` against the real record boundaries: entries that point mid-record or past
  the end, and records the ``.idx`` does not list;
- CRC32C of every payload against ``NAME.crc32c`` when present (``checksums=True``);
- with ``decode=f``, ``f(image_bytes)`` on every image; an exception is a problem (an empty
  image too, except in insightface's header and identity records, which hold none);
- for a manifest: each shard's size, ``.idx`` sha256 and record count.

:mod:`~stoker.formats.recordio.verify_remote` does the same for a set in object storage.

The result is a :class:`VerifyReport`; ``report.ok`` is true when nothing was found.
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from stoker._core.checksum import file_crc32c
from stoker._core.errors import IndexFormatError
from stoker._core.progress import make_progress
from stoker._core.schema import Schema
from stoker.formats.fields import TrailerError, decode_trailer, split_trailer
from stoker.formats.recordio.framing import LENGTH_MASK, FrameError, next_magic, read_record
from stoker.formats.recordio.header import (
    DECLARED_INT64,
    INFERRED_INT64,
    IRHeader,
    inferred_kind,
    label_problem,
    unpack_header,
    whole_numbers,
)
from stoker.formats.recordio.index import parse_idx, sha256_file
from stoker.formats.recordio.manifest import (
    MANIFEST_SUFFIX,
    load_manifest,
    manifest_schema,
    shard_paths,
)
from stoker.formats.recordio.paths import default_crc_path, default_idx_path, manifest_path_for
from stoker.formats.report import Problem, VerifyReport, decode_failure
from stoker.formats.shards import ShardEntry

__all__ = ["Problem", "VerifyReport", "verify_records"]


#: ``(key, .idx line)`` of the record at a byte offset, ``(None, None)`` when unlisted.
Who = Callable[[int], tuple[int | None, int | None]]


@dataclass(frozen=True)
class _Options:
    """What :func:`verify_records` was asked to check beyond the framing and the ``.idx``."""

    checksums: bool = True
    decode: Callable[[bytes], object] | None = None
    progress: bool | None = None
    allow_missing_checksums: bool = False
    #: the manifest's schema when its records end in a field trailer (each is parsed)
    stored: Schema | None = None
    #: the number of classes the manifest names (each one-label record's label must be one
    #: of their ids); 0: no class map, any finite label
    classes: int = 0
    #: why the labels are int64 (each must be a whole number within int64); "": any number
    whole: str = ""
    #: a bare ``.rec``'s one-number labels as the walk meets them, ``(offset, key, .idx line,
    #: label)``: their kind is inferred from all of them once it ends (``_check_inferred``)
    seen: list[tuple[int, int | None, int | None, float]] | None = None


def _nobody(off: int) -> tuple[int | None, int | None]:
    return None, None


@dataclass
class _Idx:
    """A shard's valid ``.idx``: keys, offsets and 1-based lines in ``.idx`` order."""

    keys: np.ndarray
    offsets: np.ndarray
    lines: np.ndarray

    def __post_init__(self) -> None:
        self._by_off = {o: i for i, o in enumerate(self.offsets.tolist())}

    def who(self, off: int) -> tuple[int | None, int | None]:
        i = self._by_off.get(off)
        if i is None:
            return None, None
        return int(self.keys[i]), int(self.lines[i])


def _read_idx(report: VerifyReport, idx_path: str) -> _Idx | None:
    """The ``.idx`` at ``idx_path``, or ``None`` (with the problem reported) when it is
    missing or does not parse."""
    if not os.path.exists(idx_path):
        report.add(Problem(idx_path, None, None, "the .idx file does not exist"))
        return None
    with open(idx_path, "rb") as f:
        data = f.read()
    try:
        table = parse_idx(data, idx_path, rec_size=None)
    except IndexFormatError as e:
        report.add(Problem(idx_path, None, None, e.reason, idx_line=e.line))
        return None
    lines = table.lines if table.lines is not None else np.arange(1, len(table) + 1, dtype=np.int64)
    report.indexed += len(table)
    return _Idx(table.keys, table.offsets, lines)


def _walk(
    report: VerifyReport, rec_path: str, size: int, who: Who, opts: _Options, name: str
) -> tuple[np.ndarray, np.ndarray]:
    """Walk the ``.rec`` once, reporting framing and payload problems and resynchronising
    after each; returns the offsets of the records found and (with ``checksums``) their
    CRC32Cs. ``name``: the file's name on the progress bar."""
    from stoker._core.crc import crc32c

    starts = array("q")
    crcs = array("I")
    bar = make_progress(size, f"verify {name}", unit="B", enabled=opts.progress)
    try:
        if size:
            with (
                open(rec_path, "rb") as f,
                mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm,
            ):
                view = memoryview(mm)
                try:
                    pos = 0
                    last = 0
                    while pos < size:
                        try:
                            payload, end = read_record(mm, view, size, pos)
                        except FrameError as e:
                            key, line = who(pos)
                            report.add(Problem(rec_path, key, e.offset, e.reason, line))
                            nxt = next_magic(mm, pos + 4)
                            pos = size if nxt < 0 else nxt
                            continue
                        starts.append(pos)
                        if opts.checksums:
                            crcs.append(crc32c(payload))
                        # with a decoder, the checks get a copy: a decoder may leave its
                        # frames, and the callers' above them, alive after it returns (a
                        # reference cycle), and a view of the map in one of them would keep
                        # the map from closing
                        body = payload if opts.decode is None else bytes(payload)
                        del payload
                        _check_payload(report, rec_path, body, pos, who, opts)
                        _check_padding(report, rec_path, mm, pos, end, who)
                        del body
                        pos = end
                        if pos - last >= 1 << 24:
                            bar.update(pos - last)
                            last = pos
                    bar.update(pos - last)
                finally:
                    view.release()
    finally:
        bar.close()
    found = np.frombuffer(starts, dtype=np.int64) if starts else np.zeros(0, np.int64)
    have = np.frombuffer(crcs, dtype=np.uint32) if crcs else np.zeros(0, np.uint32)
    return found, have


def _check_padding(
    report: VerifyReport, rec_path: str, mm: mmap.mmap, pos: int, end: int, who: Who
) -> None:
    """The zero padding after a one-part record's payload (dmlc writes zeros; no checksum
    covers them, so a changed byte there is found only here)."""
    lrec = int.from_bytes(mm[pos + 4 : pos + 8], "little")
    if lrec >> 29:  # a record in parts: its padding lies between the parts
        return
    pad = mm[pos + 8 + (lrec & LENGTH_MASK) : end]
    if pad.count(0) != len(pad):
        key, line = who(pos)
        report.add(
            Problem(
                rec_path, key, pos, f"the {len(pad)} padding byte(s) after it are not zero", line
            )
        )


def _check_payload(
    report: VerifyReport,
    rec_path: str,
    payload: memoryview | bytes,
    pos: int,
    who: Who,
    opts: _Options,
) -> None:
    """The IRHeader of the payload at ``pos``, its field trailer when the manifest declares
    one and, with ``opts.decode``, its image."""
    try:
        header, image = unpack_header(payload)
        if opts.stored is not None:
            image, body = split_trailer(image)
            decode_trailer(opts.stored, body, start=len(image))
    except TrailerError as e:
        key, line = who(pos)
        report.add(Problem(rec_path, key, pos, f"field trailer: {e}", line))
        return
    except ValueError as e:
        key, line = who(pos)
        report.add(Problem(rec_path, key, pos, str(e), line))
        return
    bad = label_problem(header, opts.classes, whole=opts.whole)
    if bad is not None:
        key, line = who(pos)
        report.add(Problem(rec_path, key, pos, bad, line))
    elif opts.seen is not None and header.flag == 0:
        opts.seen.append((pos, *who(pos), float(header.label)))
    decode = opts.decode
    if decode is not None and not (len(image) == 0 and _metadata_record(header)):
        data = bytes(image)
        del image
        failure = decode_failure(decode, data)
        if failure is not None:
            key, line = who(pos)
            report.add(Problem(rec_path, key, pos, failure, line))
        else:
            report.decoded += 1


def _metadata_record(header: IRHeader) -> bool:
    """Whether a record with no image is insightface's header or identity record (two
    integer labels, ``insightface.py``): it holds no image by design, so ``decode`` skips it.
    Any other empty image goes to ``decode``, which refuses it."""
    if header.flag != 2:
        return False
    return bool(np.all(np.asarray(header.label) == np.round(np.asarray(header.label))))


def _check_idx(
    report: VerifyReport, rec_path: str, size: int, idx: _Idx, found: np.ndarray
) -> None:
    """The ``.idx`` against the record boundaries the walk found, both ways."""
    hit = np.isin(idx.offsets, found)
    for i in np.flatnonzero(~hit).tolist():
        off = int(idx.offsets[i])
        what = "past the end of the file" if off + 8 > size else "not the start of a record"
        report.add(
            Problem(
                rec_path,
                int(idx.keys[i]),
                off,
                f"the .idx points at byte offset {off}, {what} (mid-record offset or .idx "
                "from another .rec)",
                int(idx.lines[i]),
            )
        )
    for off in found[~np.isin(found, idx.offsets)].tolist():
        report.add(Problem(rec_path, None, int(off), "record is not listed in the .idx"))


def _check_checksums(
    report: VerifyReport,
    rec_path: str,
    crc_path: str | None,
    idx: _Idx | None,
    found: np.ndarray,
    have: np.ndarray,
    allow_missing: bool = False,
) -> None:
    """The CRC32Cs the walk computed against the checksum file, in ``.idx`` order. A
    ``crc_path`` given (named by a manifest) that is missing is a problem unless
    ``allow_missing``."""
    cpath = crc_path if crc_path is not None else default_crc_path(rec_path)
    if not os.path.exists(cpath):
        if crc_path is not None and not allow_missing:  # the manifest names it
            report.add(
                Problem(
                    cpath,
                    None,
                    None,
                    f"the checksum file the manifest names for {rec_path} does not exist, so "
                    "its records cannot be checked (--allow-missing-checksums to accept that)",
                )
            )
            return
        report.notes.append(f"{rec_path}: no checksum file ({os.path.basename(cpath)})")
        return
    if idx is None:
        report.notes.append(f"{cpath}: not compared (needs a valid .idx)")
        return
    stored = np.fromfile(cpath, dtype="<u4")
    n = idx.offsets.shape[0]
    if stored.shape[0] * 4 != os.path.getsize(cpath) or stored.shape[0] != n:
        report.add(
            Problem(
                cpath,
                None,
                None,
                f"checksum file holds {os.path.getsize(cpath)} bytes; {n} records need {4 * n}",
            )
        )
        return
    where = np.searchsorted(found, idx.offsets)
    ok = where < found.shape[0]
    ok[ok] = found[where[ok]] == idx.offsets[ok]
    sel = np.flatnonzero(ok)
    bad = sel[have[where[sel]] != stored[sel]]
    report.checksummed += int(sel.shape[0])
    for i in bad.tolist():
        report.add(
            Problem(
                rec_path,
                int(idx.keys[i]),
                int(idx.offsets[i]),
                f"checksum mismatch: stored crc32c 0x{int(stored[i]):08x}, data has "
                f"0x{int(have[where[i]]):08x}",
                int(idx.lines[i]),
            )
        )


def _verify_shard(
    report: VerifyReport,
    rec_path: str,
    idx_path: str | None,
    crc_path: str | None,
    opts: _Options,
    name: str | None = None,
) -> None:
    """Everything :func:`verify_records` checks of one ``.rec`` (with its ``.idx`` and
    checksum file when given), into ``report``."""
    size = os.path.getsize(rec_path)
    report.data_bytes += size
    idx = _read_idx(report, idx_path) if idx_path is not None else None
    who = idx.who if idx is not None else _nobody
    found, have = _walk(report, rec_path, size, who, opts, name or os.path.basename(rec_path))
    report.records += int(found.shape[0])
    if idx is not None:
        _check_idx(report, rec_path, size, idx, found)
    if opts.checksums:
        _check_checksums(report, rec_path, crc_path, idx, found, have, opts.allow_missing_checksums)


def _with_schema(opts: _Options, manifest: dict, path: str) -> _Options:
    """``opts`` with the manifest's schema when its records store fields, and its number of
    class names."""
    schema = manifest_schema(manifest, path)
    head = schema.header_name if schema is not None else None
    classes = len(manifest.get("classes") or {})
    if schema is None:  # a manifest without a schema: its classes' ids, when it names any
        whole = classes > 0
    else:  # the declared label's kind (a vector of labels is no class id)
        whole = head is not None and schema[head].dtype == "int64"
        classes = 0 if head is not None and schema[head].shape else classes
    opts = replace(opts, classes=classes, whole=DECLARED_INT64 if whole else "")
    if schema is None or not schema.stored:
        return opts
    return replace(opts, stored=schema)


def _verify_manifest(report: VerifyReport, path: str, opts: _Options) -> None:
    """Every shard of the manifest at ``path``, and each against its entry."""
    manifest = load_manifest(path)
    opts = _with_schema(opts, manifest, path)
    for shard in manifest["shards"]:
        rec, idx_p, crc = shard_paths(path, shard)
        folders = [p for p in (rec, idx_p, crc) if p is not None and os.path.isdir(p)]
        if folders:
            report.add(
                Problem(
                    path, None, None, f"shard {shard.files['data']!r}: {folders[0]} is a folder"
                )
            )
            continue
        if not os.path.exists(rec):
            report.add(Problem(rec, None, None, "shard listed in the manifest is missing"))
            continue
        _verify_entry(report, shard, rec, idx_p, crc, opts)


def _verify_entry(
    report: VerifyReport,
    shard: ShardEntry,
    rec: str,
    idx_p: str | None,
    crc: str | None,
    opts: _Options,
    name: str | None = None,
) -> None:
    """One shard's files (local paths) against its manifest entry, and walked (``idx_p``
    ``None``: the ``.idx`` is missing, which the caller has reported)."""
    size, want = os.path.getsize(rec), shard.checksums.get("data.crc32c")
    if size != shard.bytes:
        report.add(Problem(rec, None, None, f"is {size} bytes, the manifest says {shard.bytes}"))
    want_sha = shard.checksums.get("index.sha256")
    if idx_p is not None and os.path.exists(idx_p) and sha256_file(idx_p) != want_sha:
        report.add(
            Problem(idx_p, None, None, "idx does not match rec (sha256 differs from the manifest)")
        )
    before = report.indexed
    _verify_shard(report, rec, idx_p, crc, opts, name)
    if size == shard.bytes and opts.checksums and want is not None:
        if (got := file_crc32c(rec)) != int(want):
            why = f"its CRC32C is 0x{got:08x}, the manifest's data.crc32c 0x{int(want):08x}"
            report.add(Problem(rec, None, None, f"{why}: the shard changed after it was written"))
    if idx_p is not None and report.indexed - before != shard.records:
        report.add(
            Problem(
                idx_p,
                None,
                None,
                f"lists {report.indexed - before} records, the manifest says {shard.records}",
            )
        )


def verify_records(
    path: str | os.PathLike[str],
    *,
    idx_path: str | os.PathLike[str] | None = None,
    checksums: bool = True,
    decode: Callable[[bytes], object] | None = None,
    max_problems: int = 1000,
    progress: bool | None = None,
    allow_missing_checksums: bool = False,
) -> VerifyReport:
    """Walk a ``.rec`` (or every shard of a ``NAME.stoker.json``) and report all problems.

    ``idx_path`` defaults to ``NAME.idx``; ``decode`` is a callable ``f(bytes)`` that raises
    on a bad image (e.g. ``stoker.codecs.decode``). Never raises for problems in the data
    (they go into the report); raises ``ManifestError`` for an unreadable manifest and
    ``OSError`` for a missing ``.rec``. A ``.crc32c`` that a manifest names but that is
    missing is a problem (integrity checking would be silently off) unless
    ``allow_missing_checksums``; a bare ``.rec`` without one only gets a note.
    """
    if max_problems < 0:
        raise ValueError(f"max_problems must be >= 0, got {max_problems}")
    p = os.fspath(path)
    report = VerifyReport(p, max_problems=max_problems)
    opts = _Options(checksums, decode, progress, allow_missing_checksums)
    if p.endswith(MANIFEST_SUFFIX):
        _verify_manifest(report, p, opts)
        return report
    if p.endswith(".idx"):
        idx_path = idx_path if idx_path is not None else p
        p = p[:-4] + ".rec"
        report.path = p
    idx: str | None
    if idx_path is None:
        guess = default_idx_path(p)
        idx = guess if os.path.exists(guess) else None
        if idx is None:
            report.notes.append(f"{p}: no .idx beside it; only the framing was checked")
    else:
        idx = os.fspath(idx_path)
    beside = manifest_path_for(p)
    if os.path.exists(beside):  # the manifest says whether the records end in a trailer
        opts = _with_schema(opts, load_manifest(beside), beside)
    else:  # the labels' kind is inferred from every label, as the loader does
        opts = replace(opts, seen=[])
    _verify_shard(report, p, idx, None, opts)
    if opts.seen:
        _check_inferred(report, p, opts.seen)
    return report


def _check_inferred(
    report: VerifyReport, rec_path: str, seen: list[tuple[int, int | None, int | None, float]]
) -> None:
    """The finite one-number labels of a bare ``.rec`` that do not fit the kind inferred
    from all of them (:func:`inferred_kind`: 2.5 or 1e30 among class ids)."""
    labels = np.array([s[3] for s in seen], dtype=np.float64)
    if inferred_kind(labels) != "int64":
        return
    for at in np.flatnonzero(~whole_numbers(labels)).tolist():
        pos, key, line, label = seen[at]
        bad = label_problem(IRHeader(0, label, 0, 0), whole=INFERRED_INT64)
        report.add(Problem(rec_path, key, pos, str(bad), line))
