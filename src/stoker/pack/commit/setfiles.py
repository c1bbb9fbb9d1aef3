"""The set's own files, written by every engine after its shards: the output folder made
ready (:func:`make_out_dir`), a listing's bad rows checked against ``max_rejects`` before any
image is read (:func:`check_listing_rejects`), and the rejects list, the ``.lst`` and the
manifest, last (:func:`write_set_files`)."""

from __future__ import annotations

import os

from stoker._core.errors import PackError, TooManyRejectsError
from stoker.pack.plan.listing import max_lengths
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.plan import Plan
from stoker.pack.plan.source import manifest_schema
from stoker.pack.run.outputs import (
    OutputPaths,
    class_counts,
    write_error,
    write_lst,
    write_manifest,
    write_rejects,
)
from stoker.pack.run.report import Tally

__all__ = ["check_listing_rejects", "make_out_dir", "write_set_files"]


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
