"""Packing as independent shard jobs: a plan file, shards packed anywhere, then a finalize.

NOTE [ Plan, shard jobs and finalize ]

Plan
    :func:`write_plan` lists SRC (``plan.make_plan``, as a one-machine pack does) and writes
    ``OUT.plan.json`` atomically: the options that decide the output (SRC, OUT and ``root``
    made absolute), the plan's fingerprint (``plan.fingerprint``: a digest of the settings and
    of every record's key, label and path, and of a listing's fields), the counts and each
    shard's position range. Nothing in it depends on the time, the host or the worker count:
    the same SRC and options give the same file.

Shard job
    :func:`pack_shards` reads the plan, lists SRC again and refuses when the fingerprint
    differs (SRC or the check changed since the plan was made). Each shard it is given is
    packed into its final files, records in position order through the format's writer with
    the labels and fields a one-machine pack gives them (``packer.sample_of``), each file
    written as ``*.partial`` and renamed; then ``OUT-NNNNN.pack-shard.json`` (``OUT.pack-
    shard.json`` unsharded) is written atomically: the plan's fingerprint, the shard's manifest
    entry, its files and their sizes, what each record counts for in the manifest and the
    shard's rejects. That side-car is the shard's commit point. A job holds an exclusive lock
    on ``OUT-NNNNN.pack-shard.lock`` while it works on the shard, so two jobs of one shard
    (a rerun beside a job of a killed driver that is still running) take turns. A shard whose side-car is of
    this plan and whose files have its sizes and verify (framing and every record's CRC) is
    done, and a rerun skips it; any other state (a job killed mid-shard, files renamed but no
    side-car, a damaged file) is packed again from scratch, to the same bytes.

Finalize
    :func:`finalize_pack` checks every shard as a rerun does and refuses, naming each shard
    that is missing or damaged; then merges the records' counts and the rejects in position
    order, applies ``max_rejects`` to the total, and writes the rejects list, the ``.lst``
    and the manifest last through ``packer.write_set_files``, the code a one-machine pack
    commits with: the set is byte for byte that pack's. The side-cars and locks are removed after the
    manifest; the plan file stays.

A decoder crash in a shard job run by a local pool is isolated as in a one-machine pack
(``decoder_crash``); in a Ray task (checked in the task's own process) it kills the task,
which Ray retries and finally reports as the shard's failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import time
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import Any

from stoker._core.atomic import atomic_write
from stoker._core.errors import PackError, TooManyRejectsError
from stoker._core.progress import Progress, make_progress
from stoker.pack.listing import ListingItem
from stoker.pack.options import PackOptions
from stoker.pack.outputs import (
    OutputPaths,
    ShardWriters,
    Unstorable,
    WriteFailed,
    shard_main_files,
)
from stoker.pack.packer import (
    check_listing_rejects,
    make_out_dir,
    reject_detail,
    sample_of,
    write_set_files,
)
from stoker.pack.plan import Plan, fingerprint, geometric, make_plan
from stoker.pack.pool import results
from stoker.pack.report import PackReport, Tally
from stoker.pack.worker import process

__all__ = [
    "PLAN_SUFFIX",
    "ShardOutcome",
    "ShardsReport",
    "finalize",
    "finalize_pack",
    "forget_shards",
    "load_plan",
    "pack_shards",
    "parse_shards",
    "plan_pack",
    "run_shard",
    "shard_problem",
    "write_plan",
]

PLAN_VERSION = 1
PLAN_SUFFIX = ".plan.json"
_SIDECAR_VERSION = 1

#: The options a plan file keeps besides SRC, OUT, root and schema: those of the output.
_PLAN_OPTIONS = (
    "resize",
    "quality",
    "shuffle",
    "seed",
    "shard_size",
    "list_file",
    "max_rejects",
    "max_pixels",
    "follow_symlinks",
    "allow_outside_root",
    "format",
    "labels",
)


def _paths(options: PackOptions, plan: Plan) -> OutputPaths:
    return OutputPaths.for_plan(plan, list_file=options.list_file, format=options.format)


def _bounds(plan: Plan, s: int) -> tuple[int, int]:
    n = len(plan.items)
    if plan.shard_size is None:
        return 0, n
    return min(n, s * plan.shard_size), min(n, (s + 1) * plan.shard_size)


def _sidecar(paths: OutputPaths, s: int) -> str:
    sid = paths.shard_ids[s]
    stem = paths.prefix if sid is None else f"{paths.prefix}-{sid:05d}"
    return stem + ".pack-shard.json"


def forget_shards(options: PackOptions, plan: Plan) -> None:
    """Remove every shard's side-car: each shard is then packed again."""
    paths = _paths(options, plan)
    for s in range(plan.n_shards):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_sidecar(paths, s))


# ---------------------------------------------------------------- the plan file
def plan_pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    plan: str | os.PathLike[str] | None = None,
    **options: Any,
) -> str:
    """List ``src`` and write the plan of packing it into ``out`` (``OUT.plan.json``, or
    ``plan``) with the options :func:`stoker.pack` takes; the plan file's path. Then
    :func:`pack_shards` packs its shards anywhere that sees SRC and OUT, and
    :func:`finalize_pack` writes the manifest (``docs/scale.md``)."""
    return write_plan(PackOptions(src, out, **options), plan)


def write_plan(options: PackOptions, path: str | os.PathLike[str] | None = None) -> str:
    """Write the plan of ``options`` atomically (see the module NOTE); its path."""
    if options.convert:
        raise PackError("a plan file is for stoker pack; stoker convert runs on one machine")
    # absolute paths: a shard job may run in another folder (the fingerprint covers paths)
    options = dataclasses.replace(
        options,
        src=os.path.abspath(options.src),
        out=os.path.abspath(options.prefix),
        root=os.path.abspath(options.root) if options.root else None,
    )
    plan = make_plan(options)
    make_out_dir(options.prefix)
    paths = _paths(options, plan)
    if not options.overwrite:
        paths.refuse_existing()
    check_listing_rejects(options, plan, paths)
    doc = {
        "stoker_plan": PLAN_VERSION,
        "src": options.src,
        "out": options.out,
        "root": options.root,
        "schema": options.schema.to_json() if options.schema is not None else None,
        "options": {name: getattr(options, name) for name in _PLAN_OPTIONS},
        "settings": options.journal_json(),
        "fingerprint": fingerprint(plan, options.journal_json()),
        "records": len(plan.items),
        "found": plan.scan.found,
        "listing_rejects": len(plan.scan.rejects),
        "shards": [list(_bounds(plan, s)) for s in range(plan.n_shards)],
    }
    target = os.fspath(path) if path is not None else options.prefix + PLAN_SUFFIX
    with atomic_write(target, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    return target


def load_plan(
    path: str | os.PathLike[str], *, workers: int | None = None, progress: bool | None = None
) -> tuple[PackOptions, Plan, str]:
    """The options, the plan (SRC listed again) and the fingerprint of a plan file; a
    :class:`PackError` when it is not one, or when SRC no longer gives the same plan."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as f:
            doc = json.loads(f.read())
    except OSError as e:
        raise PackError(f"{where}: cannot read the plan: {e.strerror or e}") from None
    except ValueError as e:
        raise PackError(f"{where}: not a stoker plan file (not JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("stoker_plan") != PLAN_VERSION:
        raise PackError(
            f"{where}: not a stoker plan file of version {PLAN_VERSION}; "
            "make one with stoker pack SRC OUT --plan-only"
        )
    try:
        options = PackOptions(
            doc["src"],
            doc["out"],
            root=doc["root"],
            schema=doc["schema"],
            workers=workers,
            progress=progress,
            overwrite=True,
            **doc["options"],
        )
        want, n_want = str(doc["fingerprint"]), int(doc["records"])
    except (KeyError, TypeError, ValueError) as e:
        raise PackError(f"{where}: a damaged plan file ({type(e).__name__}: {e})") from None
    plan = make_plan(options)
    fp = fingerprint(plan, options.journal_json())
    if fp != want:
        raise PackError(
            f"{where}: {options.src} no longer gives this plan ({len(plan.items)} records now, "
            f"{n_want} in the plan; or their names, labels, fields or the settings differ); "
            "make a new plan with stoker pack SRC OUT --plan-only"
        )
    return options, plan, fp


def parse_shards(spec: Any, n: int) -> range:
    """Shard numbers from ``"a:b"`` (Python slice rules, ``"a:"``, ``":b"``, negatives), ``"3"``,
    an int, a ``slice`` or a ``range``; ``ValueError`` naming the plan's shard count."""
    if isinstance(spec, range):
        spec = slice(spec.start, spec.stop, spec.step)
    if isinstance(spec, str):
        text = spec.strip()
        try:
            if ":" in text:
                a, _, b = text.partition(":")
                spec = slice(int(a) if a.strip() else None, int(b) if b.strip() else None)
            else:
                spec = int(text)
        except ValueError:
            raise ValueError(f"shards must be N or A:B (shard numbers), got {text!r}") from None
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not -n <= spec < n:
            raise ValueError(f"shard {spec} out of range: the plan has {n} shard(s), 0..{n - 1}")
        spec = slice(spec % n, spec % n + 1)
    if not isinstance(spec, slice):
        raise TypeError(f"shards must be a str, int, slice or range, got {type(spec).__name__}")
    return range(*spec.indices(n))


# ---------------------------------------------------------------- one shard
@dataclass(frozen=True)
class ShardOutcome:
    """What one shard job did: ``skipped`` (it was done and verified) or packed, and the
    positions it covers, records written and rejects."""

    shard: int
    skipped: bool
    positions: int
    written: int
    rejected: int
    seconds: float


def _read_sidecar(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("stoker_shard") == _SIDECAR_VERSION else None


def shard_problem(
    options: PackOptions, plan: Plan, fp: str, s: int, *, check: bool = True
) -> str | None:
    """Why shard ``s`` is not done (``None``: it is): no side-car of this plan, a file
    missing or of another size, or (``check``) a record whose framing or CRC is wrong."""
    paths = _paths(options, plan)
    side_path = _sidecar(paths, s)
    side = _read_sidecar(side_path)
    if side is None:
        return f"not packed ({os.path.basename(side_path)} is missing)"
    if side.get("fingerprint") != fp or side.get("shard") != s:
        return f"packed from another plan ({os.path.basename(side_path)})"
    folder = os.path.dirname(os.path.abspath(paths.prefix))
    files = side.get("files") or {}
    for name, size in files.items():
        p = os.path.join(folder, name)
        try:
            got = os.path.getsize(p)
        except OSError:
            return f"{p} is missing"
        if got != size:
            return f"{p} is {got} bytes, the shard job wrote {size}"
    if check and files:
        from stoker.formats.registry import get

        main = os.path.join(folder, str(side.get("main")))
        report = get(options.format).load("verify")(main, max_problems=1, progress=False)
        if not report.ok:
            first = report.problems[0] if report.problems else "it does not verify"
            return f"{first}"
    return None


def _inline(items: list, start: int, options: PackOptions, upright: bool) -> Generator:
    """Each item's result, checked in this process (a Ray task holds one CPU)."""
    from PIL import Image, ImageFile

    Image.MAX_IMAGE_PIXELS = None  # check_image applies max_pixels from the header itself
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    for i, it in enumerate(items):
        masks = it.masks if isinstance(it, ListingItem) else ()
        yield start + i, process(it.path, options, masks, upright=upright)


def _stream(options: PackOptions, plan: Plan, a: int, b: int, workers: int) -> Generator:
    upright = plan.schema is not None and geometric(plan.schema)
    items = plan.items[a:b]
    if workers == 0:
        yield from _inline(items, a, options, upright)
        return
    chunk = max(1, min(64, len(items) // (workers * 8) or 1))
    for pos, r in results(items, 0, options, workers, chunk, upright=upright):
        yield a + pos, r


def run_shard(
    options: PackOptions,
    plan: Plan,
    fp: str,
    s: int,
    *,
    workers: int = 0,
    bar: Progress | None = None,
) -> ShardOutcome:
    """Pack shard ``s`` of ``plan`` unless it is done (see the module NOTE); ``workers``:
    a local pool of that many processes checks the images (0: this process does)."""
    paths = _paths(options, plan)
    with _locked(_sidecar(paths, s)[: -len(".json")] + ".lock"):
        return _run_shard(options, plan, fp, s, workers, bar)


@contextlib.contextmanager
def _locked(path: str) -> Generator[None, None, None]:
    """Hold an exclusive lock on ``path`` (made when missing): one job at a time per shard
    (the task of a driver that was killed may still be running when a rerun's starts; the
    lock goes with its process)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _run_shard(
    options: PackOptions, plan: Plan, fp: str, s: int, workers: int, bar: Progress | None
) -> ShardOutcome:
    t0 = time.perf_counter()
    a, b = _bounds(plan, s)
    if shard_problem(options, plan, fp, s) is None:
        return ShardOutcome(s, True, b - a, 0, 0, time.perf_counter() - t0)
    paths = _paths(options, plan)
    side_path = _sidecar(paths, s)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(side_path)
    writers = ShardWriters(paths, plan.writer_schema, resume=False)
    records: list[list] = []
    rejects: list[list] = []
    lengths: dict[str, int] = {}
    stream = _stream(options, plan, a, b, workers)
    try:
        for pos, r in stream:
            if r[0] == 0:
                key, data, label, fields = sample_of(plan, pos, r, lengths)
                try:
                    writers.write(s, key, data, label, fields)
                except Unstorable as e:
                    r = (1, "unstorable", str(e))
                else:
                    _, _, fmt, rotated, passthrough, size_in = r[:6]
                    records.append([pos, fmt, int(rotated), int(passthrough), int(size_in)])
            if r[0] == 1:
                rejects.append([pos, r[1], reject_detail(plan, pos, r[2])])
            if bar is not None:
                bar.update(1)
        nbytes = int(writers.get(s).bytes_written)
        entry, files = writers.commit_one(s)
    except WriteFailed as e:
        writers.abort(keep_partial=False)
        raise e.error from None
    except BaseException:
        with contextlib.suppress(Exception):
            writers.abort(keep_partial=False)  # a partial shard is packed again from scratch
        raise
    finally:
        stream.close()
    side = {
        "stoker_shard": _SIDECAR_VERSION,
        "fingerprint": fp,
        "shard": s,
        "positions": [a, b],
        "entry": entry,
        "bytes": nbytes,
        "files": {os.path.basename(p): os.path.getsize(p) for p in files},
        "main": os.path.basename(files[0]),
        "records": records,
        "rejects": rejects,
    }
    with atomic_write(side_path, "w") as f:
        json.dump(side, f)  # key order kept: the entry goes into the manifest as it is
    return ShardOutcome(s, False, b - a, len(records), len(rejects), time.perf_counter() - t0)


# ---------------------------------------------------------------- the steps
@dataclass(frozen=True)
class ShardsReport:
    """What :func:`pack_shards` did: the shards packed and those skipped (done already)."""

    packed: tuple[int, ...]
    skipped: tuple[int, ...]
    written: int
    rejected: int
    seconds: float

    def summary(self) -> str:
        return (
            f"shards packed {len(self.packed)}, skipped {len(self.skipped)} (done already): "
            f"{self.written} records written, {self.rejected} rejected in {self.seconds:.1f} s"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "packed": list(self.packed),
            "skipped": list(self.skipped),
            "written": self.written,
            "rejected": self.rejected,
            "seconds": round(self.seconds, 3),
        }


def pack_shards(
    plan: str | os.PathLike[str],
    shards: Any = None,
    *,
    workers: int | None = None,
    progress: bool | None = None,
) -> ShardsReport:
    """Pack the shards ``shards`` (``"a:b"``, ``"3"``, an int, a slice or a range; ``None``:
    all) of the plan file ``plan`` with a local pool of ``workers`` processes; shards done
    already are verified and skipped."""
    t0 = time.perf_counter()
    options, p, fp = load_plan(plan, workers=workers, progress=progress)
    todo = parse_shards(":" if shards is None else shards, p.n_shards)
    n_pos = sum(b - a for a, b in (_bounds(p, s) for s in todo))
    bar = make_progress(n_pos, "pack", unit="img", enabled=options.progress)
    outcomes = []
    try:
        for s in todo:
            got = run_shard(options, p, fp, s, workers=options.worker_count(), bar=bar)
            if got.skipped:
                bar.update(got.positions)
            outcomes.append(got)
    finally:
        bar.close()
    return ShardsReport(
        packed=tuple(o.shard for o in outcomes if not o.skipped),
        skipped=tuple(o.shard for o in outcomes if o.skipped),
        written=sum(o.written for o in outcomes),
        rejected=sum(o.rejected for o in outcomes),
        seconds=time.perf_counter() - t0,
    )


def finalize_pack(plan: str | os.PathLike[str], *, progress: bool | None = None) -> PackReport:
    """Check every shard of the plan file ``plan`` and write the rejects list, the ``.lst``
    and the manifest (last); the set's :class:`PackReport`. A :class:`PackError` names each
    shard that is missing or damaged."""
    t0 = time.perf_counter()
    options, p, fp = load_plan(plan, progress=progress)
    return finalize(options, p, fp, t0)


def finalize(
    options: PackOptions, plan: Plan, fp: str, t0: float, *, resumed: Iterable[int] = ()
) -> PackReport:
    """:func:`finalize_pack` of a plan in hand (the Ray engine's last step); ``resumed``:
    the shards a rerun found done, whose records the report counts as resumed."""
    paths = _paths(options, plan)
    bad = [(s, shard_problem(options, plan, fp, s)) for s in range(plan.n_shards)]
    bad = [(s, why) for s, why in bad if why is not None]
    if bad:
        listed = "; ".join(f"shard {s}: {why}" for s, why in bad[:10])
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        raise PackError(
            f"{len(bad)} of {plan.n_shards} shard(s) not ready: {listed}{more}; pack them "
            f"(--shards {bad[0][0]}...) and finalize again"
        )
    tally = Tally(plan.scan, len(plan.items))
    entries = []
    bytes_out = 0
    resumed_set = set(resumed)
    for s in range(plan.n_shards):
        side = _read_sidecar(_sidecar(paths, s))
        assert side is not None  # shard_problem checked it
        entries.append(side["entry"])
        bytes_out += int(side["bytes"])
        for pos, fmt, rotated, passthrough, size_in in side["records"]:
            tally.wrote(pos, fmt, bool(rotated), bool(passthrough), size_in)
            if s in resumed_set:
                tally.resumed += 1
                tally.resumed_bytes_in += size_in
        tally.item_rejects.extend((pos, r, d) for pos, r, d in side["rejects"])
    tally.item_rejects.sort()
    if options.max_rejects is not None and tally.n_rejected > options.max_rejects:
        from stoker.pack.outputs import write_rejects

        write_rejects(paths.rejects, plan.scan, plan, tally.item_rejects)
        raise TooManyRejectsError(
            f"{tally.n_rejected} files rejected, more than max_rejects={options.max_rejects}; "
            f"see {paths.rejects} (shards kept; no manifest written)"
        )
    try:
        write_set_files(options, plan, paths, tally, entries, {})
    except WriteFailed as e:
        raise e.error from None
    for s in range(plan.n_shards):
        side_path = _sidecar(paths, s)
        for p in (side_path, side_path[: -len(".json")] + ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
    tally.check_accounting()
    return tally.report(
        shards=shard_main_files(paths, entries),
        bytes_out=bytes_out,
        seconds=time.perf_counter() - t0,
        manifest=paths.manifest,
        rejects_path=paths.rejects,
        list_path=paths.lst,
        format=options.format,
    )
