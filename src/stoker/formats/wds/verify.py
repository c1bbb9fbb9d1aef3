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
from stoker._core.errors import CorruptRecordError, StokerError
from stoker._core.progress import make_progress
from stoker._core.schema import Schema
from stoker.formats.manifest import MANIFEST_SUFFIX, load, manifest_schema, shard_file
from stoker.formats.remote import RemoteOptions, redact, remote_url
from stoker.formats.report import Problem, VerifyReport, decode_failure
from stoker.formats.shards import ShardEntry
from stoker.formats.verify_remote import verify_shards
from stoker.formats.wds.index import build_index
from stoker.formats.wds.layout import IMAGE_SUFFIXES, RAW_FIELDS, field_suffixes, raw_schema
from stoker.formats.wds.reader import WdsReader
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
    if max_problems < 0:
        raise ValueError(f"max_problems must be >= 0, got {max_problems}")
    p = os.fspath(path)
    if remote_url(p) is not None:

        def entry(report: VerifyReport, local: dict[str, str], s: ShardEntry, m: dict) -> None:
            crc = local.get("crc") if checksums else None
            _verify_entry(report, local["data"], s, _fields(m, redact(p)), checksums, decode, crc)

        report = verify_shards(
            p,
            remote=remote,
            kind=KIND,
            verify_entry=entry,
            max_problems=max_problems,
        )
        return _no_sums(report, checksums)
    report = VerifyReport(p, max_problems=max_problems)
    listed = _as_the_reader_reads(p)
    if listed is None:
        _verify_tar(report, p, _raw_fields(), decode, None)
        report.notes.append(_UNCHECKED)
        return report
    manifest, m = listed
    fields = _fields(m, manifest)
    bar = make_progress(len(m["shards"]), "verify", unit="shard", enabled=progress)
    try:
        for s in m["shards"]:
            tar = str(shard_file(manifest, s, "data"))
            if not os.path.isfile(tar):
                report.add(Problem(tar, None, None, "the shard the manifest lists does not exist"))
                continue
            crc = shard_file(manifest, s, "crc") if checksums else None
            _verify_entry(report, tar, s, fields, checksums, decode, crc)
            bar.update(1)
    finally:
        bar.close()
    if checksums and any("crc" not in s.files for s in m["shards"]):
        report.notes.append(_UNCHECKED)
    return _no_sums(report, checksums)


def _as_the_reader_reads(path: str) -> tuple[str, dict] | None:
    """The manifest the reader reads ``path`` as (its path, and the manifest with the shards
    read): ``path`` itself, or the sibling manifest that lists the bare tar ``path``; ``None``
    for a tar read bare (the reader's refusal to open one is the loader's, reported as such by
    ``stoker verify``)."""
    if path.endswith(MANIFEST_SUFFIX):
        return path, load(path, kind=KIND)
    try:
        with WdsReader(path) as r:
            return (str(r.manifest_path), r.manifest) if r.manifest is not None else None
    except (StokerError, OSError):
        return None


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


_UNCHECKED = (
    "no per-sample checksums (a tar without a stoker .crc32c side-car): its samples' bytes are "
    "not checked, only its structure"
)


def _no_sums(report: VerifyReport, checksums: bool) -> VerifyReport:
    if not checksums:
        report.notes.append("shard sha256 sums not compared (checksums=False)")
    return report
