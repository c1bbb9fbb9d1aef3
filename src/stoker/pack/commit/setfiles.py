"""The set's own files, written by every engine after its shards: the output folder made
ready (:func:`make_out_dir`), a listing's bad rows checked against ``max_rejects`` before any
image is read (:func:`check_listing_rejects`), and the finalize (:func:`finalize`): every
shard checked, the side-cars merged in shard order (:func:`commit_set`), ``max_rejects``
applied to the total, every count checked, and the rejects list, the ``.lst`` and the
manifest written last (:func:`write_set_files`)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable

from stoker._core.errors import PackError, TooManyRejectsError
from stoker.pack.plan.listing import max_lengths
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.plan import Plan
from stoker.pack.plan.source import manifest_schema
from stoker.pack.run.outputs import (
    OutputPaths,
    WriteFailed,
    class_counts,
    shard_main_files,
    write_error,
    write_lst,
    write_manifest,
    write_rejects,
)
from stoker.pack.run.report import PackReport, ShardCounts, Tally
from stoker.pack.run.shardjob import (
    lock_path,
    output_paths,
    read_sidecar,
    shard_problem,
    sidecar_path,
)

__all__ = [
    "check_listing_rejects",
    "commit_set",
    "finalize",
    "make_out_dir",
    "not_ready",
    "write_set_files",
]


def check_listing_rejects(options: PackOptions, plan: Plan, paths: OutputPaths) -> None:
    """A listing's bad rows count against ``max_rejects`` before any image is read."""
    max_rejects = options.max_rejects
    n_rej = len(plan.scan.rejects)
    if plan.schema is None or max_rejects is None or n_rej <= max_rejects:
        return
    write_rejects(paths.rejects, plan.scan, plan, [])
    raise TooManyRejectsError(
        f"{n_rej} listing rows rejected, more than max_rejects={max_rejects}; see {paths.rejects}"
    )


def make_out_dir(prefix: str) -> None:
    """The output's folder, created (with its parents) when missing, and writable."""
    out_dir = os.path.dirname(os.path.abspath(prefix))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except FileExistsError:
        raise PackError(
            f"{out_dir}: cannot create the output folder: a file is in the way"
        ) from None
    except OSError as e:
        raise PackError(f"{out_dir}: cannot create the output folder: {e.strerror or e}") from None
    if not os.access(out_dir, os.W_OK):
        raise PackError(f"{out_dir}: output folder is not writable")


#: the fix for a pack whose every file was rejected, by the commonest reason
_FIXES = {
    "outside_root": "give root= (--root) a folder that holds them, or pass allow_outside_root="
    "True (--allow-outside-root)",
    "missing": "a relative path is read from root= (--root), by default the listing's folder",
    "bad_field": "fix those fields, or give schema= (--schema) the fields' types",
}


def _nothing_packed(reasons: dict[str, int], n: int, rejects: str) -> str:
    """One line for a pack that wrote nothing: its commonest reject reason and the fix."""
    why = max(reasons, key=lambda r: reasons[r])
    fix = _FIXES.get(why, "each file's reason is in the rejects list")
    return f"nothing packed: all {n} files were rejected, {reasons[why]} of them {why}; {fix}; see {rejects}"


def write_set_files(
    options: PackOptions,
    plan: Plan,
    paths: OutputPaths,
    tally: Tally,
    entries: list[dict],
    lengths: dict[str, int],
) -> None:
    """After the shards: the rejects list, the ``.lst`` and the manifest (last), from the
    plan, the run's counts and the shards' manifest entries in shard order."""
    try:
        write_rejects(paths.rejects, plan.scan, plan, tally.item_rejects)
        if paths.lst:
            write_lst(paths.lst, plan, tally.written)
    except OSError as e:
        raise write_error(e, paths.lst or paths.rejects, None) from None
    pack_meta = {
        **options.manifest_json(from_lst=plan.from_lst, listing=plan.schema is not None),
        **tally.manifest_counts(),
        "class_counts": class_counts(plan, tally.written),
    }
    rejects_meta = {
        "count": tally.n_rejected,
        "reasons": tally.reasons(),
        "file": os.path.basename(paths.rejects),
    }
    # every manifest states its samples' schema, the label's kind with it (a set of int64
    # class ids is never turned float32 by one record's label, as an inferred kind could be)
    if plan.schema is not None:
        schema = plan.schema.with_max_len(max_lengths(plan.schema, plan.items, tally.written))
    else:
        schema = manifest_schema(plan.writer_schema, lengths if plan.reader is not None else {})
    if options.convert:
        pack_meta["source_format"] = plan.reader.format
    write_manifest(paths, entries, plan.scan.classes, pack_meta, rejects_meta, schema=schema)


def not_ready(plan: Plan, problems: list[tuple[int, str | None]]) -> None:
    """Raise a :class:`PackError` naming the shards with a problem (up to ten of them)."""
    bad = [(s, why) for s, why in problems if why is not None]
    if bad:
        listed = "; ".join(f"shard {s}: {why}" for s, why in bad[:10])
        more = f" (and {len(bad) - 10} more)" if len(bad) > 10 else ""
        raise PackError(
            f"{len(bad)} of {plan.n_shards} shard(s) not ready: {listed}{more}; pack them "
            f"(--shards {bad[0][0]}...) and finalize again"
        )


def finalize(
    options: PackOptions,
    plan: Plan,
    fp: str,
    t0: float,
    *,
    resumed: Iterable[int] = (),
    check: bool = True,
) -> PackReport:
    """``steps.finalize_pack`` of a plan in hand (an engine's last step); ``resumed``: the
    shards a rerun found done, whose records the report counts as resumed; ``check=False``:
    each shard's side-car and file sizes are checked, not its records (the caller's own jobs
    just wrote or verified every shard)."""
    paths = output_paths(options, plan)
    problems = [(s, shard_problem(options, plan, fp, s, check=check)) for s in range(plan.n_shards)]
    not_ready(plan, problems)
    sides = [read_sidecar(sidecar_path(paths, s)) or {} for s in range(plan.n_shards)]
    report = commit_set(options, plan, sides, t0, resumed=resumed)
    for s in range(plan.n_shards):
        for p in (sidecar_path(paths, s), lock_path(paths, s)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
    return report


def commit_set(
    options: PackOptions,
    plan: Plan,
    sides: list[dict],
    t0: float,
    *,
    resumed: Iterable[int] = (),
) -> PackReport:
    """From every shard's side-car (checked), in shard order: merge the records' counts and
    the rejects, apply ``max_rejects`` to the total, and write the rejects list, the ``.lst``
    and the manifest (last) under the plan's prefix; the set's report."""
    paths = output_paths(options, plan)
    tally = Tally(plan.scan, plan.items)
    entries = []
    bytes_out = 0
    lengths: dict[str, int] = {}
    resumed_set = set(resumed)
    for s, side in enumerate(sides):
        entries.append(side["entry"])
        bytes_out += int(side["bytes"])
        ShardCounts.add_to(tally, side["counts"], resumed=s in resumed_set)
        tally.item_rejects.extend((pos, r, d) for pos, r, d in side["rejects"])
        for name, n in (side.get("lengths") or {}).items():
            lengths[name] = max(lengths.get(name, 0), int(n))
    tally.item_rejects.sort()
    too_many = options.max_rejects is not None and tally.n_rejected > options.max_rejects
    if too_many or (tally.n_rejected and not tally.n_written):
        write_rejects(paths.rejects, plan.scan, plan, tally.item_rejects)
        raise TooManyRejectsError(
            f"{tally.n_rejected} files rejected, more than max_rejects={options.max_rejects}; "
            f"see {paths.rejects} (shards kept; no manifest written; rerun to resume)"
            if too_many
            else _nothing_packed(tally.reasons(), tally.n_rejected, paths.rejects)
        )
    tally.check_accounting()  # before anything of the set is written: never a short set
    try:
        write_set_files(options, plan, paths, tally, entries, lengths)
    except WriteFailed as e:
        raise e.error from None
    return tally.report(
        shards=shard_main_files(paths, entries),
        bytes_out=bytes_out,
        seconds=time.perf_counter() - t0,
        manifest=paths.manifest,
        rejects_path=paths.rejects,
        list_path=paths.lst,
        format=options.format,
        action="converted" if options.convert else "packed",
    )
