"""``verify`` for TFRecord: walk every record of a file (or of every shard a manifest lists)
and report each problem with the file, the record, the byte offset and the reason.

Checked per record: the header fits in the file, the length CRC, the length against the
bytes left, the data CRC (``checksums=True``), that the Example parses, that it has a
non-empty image, that every field the set declares (or that the first record shows) reads,
and with ``decode=f`` that ``f(image)`` does not raise. A bad length ends the walk of that
file (the next record's place is unknown); any other problem skips to the next record.
Problems in the data never raise: they go into the report.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Any

from stoker._core.errors import CorruptRecordError
from stoker._core.progress import make_progress
from stoker._core.schema import Field
from stoker.formats.protowire import WireError
from stoker.formats.report import Problem, VerifyReport, decode_failure
from stoker.formats.shards import ShardEntry
from stoker.formats.tfrecord.example import parse_features
from stoker.formats.tfrecord.features import (
    FeaturePlan,
    FieldError,
    Resolved,
    check_follows,
    default_plan,
    field_value,
    manifest_plan,
    resolve,
    settle_label,
    wanted_features,
)
from stoker.formats.tfrecord.framing import HEADER, FrameError, read_frame
from stoker.formats.tfrecord.shard import DEFAULT_KEYS, check_not_gzip
from stoker.formats.tfrecord.writer import KIND
from stoker.formats.verify_remote import RemoteOptions, verify_set

__all__ = ["verify"]


def verify(
    path: str | os.PathLike[str],
    *,
    checksums: bool = True,
    decode: Callable[[bytes], object] | None = None,
    max_problems: int = 1000,
    progress: bool | None = None,
    image_key: str = DEFAULT_KEYS["image_key"],
    label_key: str | None = DEFAULT_KEYS["label_key"],
    boxes_key: str | None = DEFAULT_KEYS["boxes_key"],
    classes_key: str | None = DEFAULT_KEYS["classes_key"],
    features: dict[str, Any] | None = None,
    remote: RemoteOptions | None = None,
) -> VerifyReport:
    """Walk a ``.tfrecord`` or a TFRecord set's manifest's shards; see the module
    docstring. The feature names of a bare file are the reader's options (a manifest names
    its own). Raises ``ManifestError`` for an unreadable manifest only. A manifest's URL is
    walked shard by shard from fresh downloads (``remote``: how to reach it;
    :mod:`stoker.formats.verify_remote`)."""
    keys = {
        "image_key": image_key,
        "label_key": label_key,
        "boxes_key": boxes_key,
        "classes_key": classes_key,
    }

    def entry(report: VerifyReport, local: dict[str, str], s: ShardEntry, m: dict) -> None:
        _verify_entry(report, local["data"], s, manifest_plan(m), checksums, decode, progress)

    def bare(report: VerifyReport, p: str) -> None:
        plan = default_plan(**keys, features=features)  # type: ignore[arg-type]
        _verify_file(report, p, plan, checksums, decode, progress)

    report = verify_set(
        path,
        KIND,
        entry=entry,
        bare=bare,
        max_problems=max_problems,
        progress=progress,
        remote=remote,
        sibling=not features and keys == DEFAULT_KEYS,  # as the reader reads it
    )
    report.notes.insert(0, _NO_INDEX)
    return report


def _verify_entry(
    report: VerifyReport,
    f: str,
    s: ShardEntry,
    plan: FeaturePlan,
    checksums: bool,
    decode: Callable[[bytes], object] | None,
    progress: bool | None,
) -> None:
    """Check manifest entry ``s`` against file ``f``: its size, then every record."""
    size, nbytes, records = os.path.getsize(f), s.bytes, s.records
    if size != nbytes:
        report.add(Problem(f, None, None, f"{size} bytes, the manifest says {nbytes}"))
    found = _verify_file(report, f, plan, checksums, decode, progress)
    if found is not None and found != records:
        report.add(Problem(f, None, None, f"{found} records, the manifest says {records}"))


_NO_INDEX = "TFRecord has no index file: the walk itself finds every record"


def _verify_file(
    report: VerifyReport,
    path: str,
    plan: FeaturePlan,
    checksums: bool,
    decode: Callable[[bytes], object] | None,
    progress: bool | None,
) -> int | None:
    """Walk one file into ``report``; the number of records found (``None``: not walked)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            check_not_gzip(path, f.read(HEADER))
            if size == 0:
                report.notes.append(f"{path}: empty file (0 records)")
                return 0
            mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    except CorruptRecordError as e:
        report.add(Problem(path, None, e.offset, e.reason))
        return None
    except OSError as e:
        report.add(Problem(path, None, None, f"cannot read: {e.strerror or e}"))
        return None
    view = memoryview(mm)
    bar = make_progress(size, f"verify {os.path.basename(path)}", unit="B", enabled=progress)
    try:
        return _walk(report, path, view, size, plan, checksums, decode, bar)
    finally:
        bar.close()
        view.release()
        mm.close()


def _walk(
    report: VerifyReport,
    path: str,
    view: memoryview,
    size: int,
    plan: FeaturePlan,
    checksums: bool,
    decode: Callable[[bytes], object] | None,
    bar: Any,
) -> int:
    plan = settle_label(plan, view, size)
    wanted = wanted_features(plan)
    resolved: Resolved | None = None
    off = i = 0
    while off < size:
        try:
            data, end = read_frame(view, size, off, check_data=False)
        except FrameError as e:
            report.add(Problem(path, i, e.offset, f"record {i}: {e.reason}"))
            break
        report.records += 1
        report.data_bytes += end - off
        bar.update(end - off)
        if decode is not None:
            # a copy: a decoder may leave its frames, and this one above them, alive after it
            # returns (a reference cycle), and a view of the map here would keep it open
            data = memoryview(bytes(data))
        problem: tuple[int, str] | None = None
        if checksums:
            try:
                read_frame(view, size, off)
                report.checksummed += 1
            except FrameError as e:
                problem = (e.offset, e.reason)
        if problem is None:
            try:
                feats = parse_features(data, wanted)
                if resolved is None:
                    resolved = resolve(plan, data, feats)
                image = _check_fields(resolved, data, feats)
                if decode is not None:
                    failure = decode_failure(decode, bytes(image))
                    if failure is None:
                        report.decoded += 1
                    else:
                        problem = (off, failure)
            except WireError as e:
                problem = (off + HEADER + e.offset, f"Example does not parse: {e.reason}")
            except FieldError as e:
                problem = (off if e.pos is None else off + HEADER + e.pos, str(e))
        if problem is not None:
            report.add(Problem(path, i, problem[0], f"record {i}: {problem[1]}"))
        off, i = end, i + 1
    return i


def _check_fields(resolved: Resolved, data: memoryview, feats: dict) -> memoryview:
    """Read every field of one record (raising ``FieldError``); the image bytes."""
    values: dict[str, Any] = {}
    image: memoryview | None = None
    for n, ft, f in resolved.entries:
        v = field_value(n, ft, f, data, feats)
        if f.kind == "image":
            image = v
        else:
            try:
                values[n] = f.check(v, name=n) if f.geometry is None else v
            except ValueError as e:
                raise FieldError.from_check(n, e) from None
    bad = check_follows(resolved.entries, values)
    if bad is not None:
        raise FieldError(
            bad[0], f"{len(values[bad[0]])} rows, {bad[1]!r} has {len(values[bad[1]])}"
        )
    assert image is not None
    Field.image().check(image, name="image")
    return image
