"""Whole-set verification of WebDataset shards (what ``stoker verify`` runs on a ``.tar`` or a
stoker-wds manifest).

Every header is walked and its checksum compared; every finding the reader would refuse is
reported (sizes past the end, links and devices, unsafe names, a key that comes back, a
sample without exactly one image, a bad ``.cls``, a missing end-of-archive marker); every
image must be non-empty (and decode, with ``decode=f``); every field must parse. For a
manifest: each shard's size and sample count, its sha256 when recorded, and each sample's
CRC32C against the shard's ``.crc32c`` side-car when it names one (``checksums``). A bare tar
is walked as the reader reads it: as its sibling manifest's entry when that lists it; else (a
tar stoker did not write) it has no per-sample checksums, and the report says so.
A header that cannot be trusted ends the walk of its tar (nothing after it can be located).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Mapping
from typing import Any

from stoker._core.checksum import file_sha256
from stoker._core.errors import CorruptRecordError
from stoker._core.schema import Schema
from stoker.formats.manifest import manifest_schema
from stoker.formats.report import Problem, VerifyReport, decode_failure
from stoker.formats.shards import ShardEntry
from stoker.formats.verify_remote import RemoteOptions, verify_set
from stoker.formats.wds.index import build_index, index_file
from stoker.formats.wds.layout import IMAGE_SUFFIXES, RAW_FIELDS, field_suffixes, raw_schema
from stoker.formats.wds.shard import CrcCheck, check_uncompressed, decode_field, read_crcs
from stoker.formats.wds.tarfmt import Walk
from stoker.formats.wds.writer import KIND

__all__ = ["verify"]

Decode = Callable[[bytes], object]


def _raw_fields() -> tuple[Schema, dict[str, str]]:
    schema = raw_schema({name: 0 for name in RAW_FIELDS.values()})
    return schema, {name: suffix for suffix, name in RAW_FIELDS.items()}


def _check_samples(
    report: VerifyReport,
    path: str,
    view: memoryview,
    index: Any,
    fields: tuple[Schema, Mapping[str, str]],
    decode: Decode | None,
    crcs: Any = None,
) -> None:
    schema, suffixes = fields
    img_off, img_size = index.column(IMAGE_SUFFIXES)
    cols = {name: index.column({suffix}) for name, suffix in suffixes.items()}
    stored = schema.stored
    for j in range(len(index)):
        key = index.key_name(j)
        o, n = int(img_off[j]), int(img_size[j])
        if crcs is not None:
            report.checksummed += 1
            bad = crcs.problem(view, j)
            if bad is not None:
                report.add(Problem(path, j, int(index.headers[j]), f"sample {key!r}: {bad}"))
        if o >= 0 and n == 0:
            report.add(Problem(path, j, o, f"sample {key!r}: its image member is empty"))
        elif o >= 0 and decode is not None:
            failure = decode_failure(decode, bytes(view[o : o + n]))
            if failure is None:
                report.decoded += 1
            else:
                report.add(Problem(path, j, o, f"sample {key!r}: {failure}"))
        for name, (off, size) in cols.items():
            try:
                decode_field(
                    view,
                    int(off[j]),
                    int(size[j]),
                    stored[name],
                    name,
                    suffixes[name],
                    (path, key, j),
                )
            except CorruptRecordError as e:
                report.add(Problem(path, j, e.offset, e.reason))


def _verify_tar(
    report: VerifyReport,
    path: str,
    fields: tuple[Schema, Mapping[str, str]],
    decode: Decode | None,
    expect: int | None,
    crc: str | None = None,
) -> None:
    def on_problem(offset: int, reason: str) -> None:
        report.add(Problem(path, None, offset, reason))

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            check_uncompressed(path, f.read(8))
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
    except CorruptRecordError as e:
        report.add(Problem(path, None, e.offset, e.reason))
        return
    except OSError as e:
        report.add(Problem(path, None, None, f"cannot read: {e.strerror or e}"))
        return
    view = memoryview(mm) if mm is not None else memoryview(b"")
    try:
        state = Walk(path, size)
        index = build_index(view, size, on_problem, state)
        report.records += len(index)
        report.indexed += len(index)
        report.data_bytes += size
        report.checksummed += state.headers
        if expect is not None and len(index) != expect:
            on_problem(0, f"holds {len(index)} samples, the manifest says {expect}")
        crcs = None
        if crc is not None:
            try:
                crcs = CrcCheck(index, read_crcs(crc, len(index)))
            except CorruptRecordError as e:
                report.add(Problem(crc, None, None, e.reason))
            except OSError as e:
                report.add(Problem(crc, None, None, f"cannot read: {e.strerror or e}"))
        _check_samples(report, path, view, index, fields, decode, crcs)
    finally:
        view.release()
        if mm is not None:
            mm.close()


def verify(
    path: str | os.PathLike[str],
    *,
    checksums: bool = True,
    decode: Decode | None = None,
    max_problems: int = 1000,
    progress: bool | None = None,
    remote: RemoteOptions | None = None,
) -> VerifyReport:
    """Walk a ``.tar`` or every shard of a WebDataset set's manifest and report every problem.
    Never raises for problems in the data (they go into the report); raises
    ``ManifestError`` for an unreadable manifest. A manifest's URL is walked shard by shard
    from fresh downloads (``remote``: how to reach it; :mod:`stoker.formats.verify_remote`)."""
    unchecked: list[object] = []

    def entry(report: VerifyReport, local: dict[str, str], s: ShardEntry, m: dict) -> None:
        crc = local.get("crc") if checksums else None
        if checksums and crc is None:
            unchecked.append(s)
        _verify_entry(report, local["data"], s, _fields(m, report.path), checksums, decode, crc)
        if "index" in local:
            _check_side_car(report, local["data"], local["index"])

    def bare(report: VerifyReport, p: str) -> None:
        _verify_tar(report, p, _raw_fields(), decode, None)
        unchecked.append(p)

    report = verify_set(
        path,
        KIND,
        entry=entry,
        bare=bare,
        max_problems=max_problems,
        progress=progress,
        remote=remote,
    )
    if unchecked:
        report.notes.append(_UNCHECKED)
    if not checksums:
        report.notes.append("shard sha256 sums not compared (checksums=False)")
    return report


def _fields(m: dict, where: str) -> tuple[Schema, dict[str, str]]:
    schema = manifest_schema(m, where) or Schema.classification()
    return schema, field_suffixes(schema)


def _verify_entry(
    report: VerifyReport,
    tar: str,
    s: ShardEntry,
    fields: tuple[Schema, dict[str, str]],
    checksums: bool,
    decode: Decode | None,
    crc: str | None = None,
) -> None:
    """Check manifest entry ``s`` against file ``tar``: its size, sha256, every sample (and
    its CRC32C against the side-car ``crc``, when given)."""
    size = os.path.getsize(tar)
    if size != s.bytes:
        report.add(Problem(tar, None, None, f"is {size} bytes, the manifest says {s.bytes}"))
    elif checksums and s.checksums.get("data.sha256"):
        report.checksummed += 1
        if file_sha256(tar) != s.checksums["data.sha256"]:
            report.add(Problem(tar, None, None, "sha256 differs from the manifest's"))
    _verify_tar(report, tar, fields, decode, s.records, crc)


def _check_side_car(report: VerifyReport, tar: str, side: str) -> None:
    """The index ``stoker index`` wrote beside ``tar`` is the tar's index as it is now (a tar
    whose walk found problems is reported by the walk alone)."""
    try:
        built = b"".join(index_file(tar, tar).chunks())
    except (CorruptRecordError, OSError):
        return
    try:
        with open(side, "rb") as f:
            same = f.read(len(built) + 1) == built
    except OSError as e:
        report.add(Problem(side, None, None, f"cannot read: {e.strerror or e}"))
        return
    if not same:
        why = f"is not the member index of {tar} as it is now: run `stoker index` again"
        report.add(Problem(side, None, None, why))


_UNCHECKED = (
    "no per-sample checksums (a tar without a stoker .crc32c side-car): its samples' bytes are "
    "not checked, only its structure"
)
