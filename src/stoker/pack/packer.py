"""``stoker.pack``: drive one pack run from its options to the committed shards, lists and
manifest.

NOTE [ Packer processes, order and shutdown ]

Who does what
    The main process lists the input once and fixes the order, every record's key and shard
    before any image is read (``plan.py``). Worker processes (a ``ProcessPoolExecutor`` on the
    ``forkserver`` context) read and check chunks of files and send back the bytes to store,
    or a reject verdict (``worker.py``); results come back in record order (``pool.py``).
    The main process alone writes (``outputs.py``), so the output bytes do not depend on
    ``workers``, and it counts what happened (``report.py``).

Resume
    With ``resume=True`` a rerun whose plan (input list, labels, settings) has the same
    fingerprint reopens the partial shards (``RecordWriter(resume=True)`` keeps every complete
    record and cuts the torn tail). Every position up to the last record kept was decided by
    the earlier run (written, or rejected and journalled); the run continues after it. The
    manifest's counts of the kept records (source formats, stored as is, re-encoded, rotated)
    come from the records journal, whose lines are flushed just before the shards; a kept record
    whose line a kill lost (the shard writer may push bytes out on its own) is checked again
    from its source file in the main process, so a resumed run's manifest equals a clean
    run's byte for byte. A different plan starts over, and so does a run killed while
    committing.

Shutdown
    Normal end: pool shut down (workers joined), partials committed in order shards → lists →
    manifest, journal removed. Exception or Ctrl-C (``KeyboardInterrupt``) or ``SystemExit``
    from a SIGTERM handler: pending chunks cancelled, each worker finishes the chunk it holds
    and exits (one still busy after a grace period is killed), partials flushed and kept for a
    resume, the exception propagates. Workers ignore SIGINT and SIGTERM: a signal sent to the
    whole process group is the main process's to act on, and a worker killed by it half-way
    through sending a result would leave the pool's management thread waiting forever for the
    rest of the message (``_procs.py``). Write errors (ENOSPC, EFBIG) name
    the output path and remove the partials. SIGKILL of the main process: each worker watches
    the main process (a pidfd) and exits when it is gone, and then the forkserver exits too
    (``_procs.py``); the partials stay for a resume.

Timeouts
    None: a worker is only ever waited on while it is alive; a worker stuck forever in a
    decoder would stall the run (no such case is known for libjpeg-turbo or Pillow with the
    limits set here).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker._core.errors import TooManyRejectsError
from stoker._core.progress import Progress, make_progress
from stoker.formats.remote import is_url
from stoker.pack.images import DEFAULT_MAX_PIXELS
from stoker.pack.options import PackOptions, output_prefix
from stoker.pack.outputs import (
    OutputPaths,
    RecordLog,
    RecordRow,
    RejectLog,
    ShardWriters,
    Unstorable,
    WriteFailed,
    read_record_journal,
    read_reject_journal,
    remove_partials,
    shard_main_files,
    write_rejects,
)
from stoker.pack.plan import Plan, fingerprint, geometric, make_plan
from stoker.pack.pool import results
from stoker.pack.records import reject_detail, sample_of
from stoker.pack.report import PackReport, Tally
from stoker.pack.setfiles import check_listing_rejects, make_out_dir, write_set_files
from stoker.pack.worker import process

__all__ = ["PackOptions", "PackReport", "convert", "output_prefix", "pack", "run_pack"]

_FLUSH_EVERY_S = 0.1  # bounds the records a kill can lose


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    workers: int | None = None,
    resize: int | None = None,
    quality: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    shard_size: int | None = None,
    list_file: bool = False,
    overwrite: bool = False,
    resume: bool = True,
    max_rejects: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    follow_symlinks: bool = False,
    root: str | os.PathLike[str] | None = None,
    allow_outside_root: bool = False,
    progress: bool | None = None,
    schema: Any = None,
    format: str = "recordio",
    labels: str = "folders",
    engine: str = "local",
    ray_address: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    layout: str = "plain",
    _check: Callable[..., Any] | None = None,
) -> PackReport:
    """Pack an image folder (one class per top-level subfolder), an im2rec ``.lst``, or a
    ``.jsonl``/``.csv`` listing of images with fields (``docs/pack.md``) into
    ``OUT.rec``/``OUT.idx`` (``OUT-NNNNN.*`` with ``shard_size``), ``OUT.crc32c``,
    ``OUT.stoker.json``, ``OUT.rejects.tsv`` and, with ``list_file``, ``OUT.lst``.

    ``workers``: processes (default: all cores). ``resize``: shorter side in pixels;
    ``quality``: JPEG quality; either re-encodes every image (default: original JPEG bytes are
    kept). ``shuffle``/``seed``: a seeded order. ``max_rejects``: raise
    :class:`TooManyRejectsError` when more files are rejected (after writing the rejects file).
    ``max_pixels``: header pixel limit (decompression bombs). ``root``: folder that ``.lst``
    paths are relative to (default: the list's folder); a listed path that is absolute or leads
    outside it is rejected ``outside_root`` unless ``allow_outside_root``; the same holds for
    a listing's image and mask paths. ``format``: what to write, ``"recordio"`` (the
    default: ``OUT.rec`` …, as above), ``"tfrecord"`` or ``"wds"`` (WebDataset ``.tar``
    shards), each with the same manifest, rejects list and resume. ``schema``: a listing's schema in place of the one its
    rows imply (a ``Schema``, its JSON dict or a JSON file). ``labels``: a folder's labels,
    ``"folders"`` (one class per top-level subfolder; images with no subfolder to class them
    are refused) or ``"none"`` (every record labelled 0, no class names). ``OUT``'s folder is
    created when missing, after the source was found. ``progress``: a bar on stderr
    (default: when stderr is a terminal). ``engine``: ``"local"`` (default: this machine's
    process pool) or ``"ray"`` (one Ray task per shard, on the cluster at ``ray_address`` or
    ``RAY_ADDRESS``, else on a Ray started here; needs ``pip install stoker[ray]``); both
    write the same bytes (``docs/scale.md``). ``out`` may be a URL (``s3://``, ``gs://``, ...):
    the pack is staged locally, then uploaded, manifest last (``storage_options``: how to reach
    it; ``docs/remote.md``). ``layout``: ``"plain"`` (default) or ``"insightface"``: one
    ``.rec`` whose images are keys ``1..N``, one identity per class folder, followed by
    insightface's header record 0 and one record per identity with its range of keys, as
    insightface's training code reads them (any reject stops the run). ``_check``: internal, a module-level stand-in for
    ``check_image`` run in the workers (fault-injection tests). See ``docs/pack.md`` for the
    checks, the normalisation policy and resume.

    The options are checked by :class:`PackOptions` (``TypeError`` for a wrong type,
    ``ValueError`` out of range); :func:`run_pack` takes one made already.
    """
    options = PackOptions(
        src,
        out,
        workers=workers,
        resize=resize,
        quality=quality,
        shuffle=shuffle,
        seed=seed,
        shard_size=shard_size,
        list_file=list_file,
        overwrite=overwrite,
        resume=resume,
        max_rejects=max_rejects,
        max_pixels=max_pixels,
        follow_symlinks=follow_symlinks,
        root=root,
        allow_outside_root=allow_outside_root,
        progress=progress,
        schema=schema,
        check=_check,
        format=format,
        labels=labels,
        engine=engine,
        ray_address=ray_address,
        layout=layout,
    )
    return run_pack(options, storage_options=storage_options)


def run_pack(
    options: PackOptions, *, storage_options: Mapping[str, Any] | None = None
) -> PackReport:
    """Pack as ``options`` say (see :func:`pack`)."""
    if options.engine == "ray":  # a URL OUT too: each task uploads its own shard
        from stoker.pack.ray_engine import run_ray

        return run_ray(options, storage_options=storage_options)
    if options.convert:  # shard jobs, each reading its positions and writing its shard
        from stoker.pack.jobs import LocalEngine, run_jobs

        engine = LocalEngine(options.worker_count())
        return run_jobs(options, engine, storage_options=storage_options)
    if is_url(options.prefix):
        from stoker.pack.remote import run_remote

        return run_remote(options, run_pack, storage_options=storage_options)
    t0 = time.perf_counter()
    n_workers = options.worker_count()
    plan = make_plan(options)  # a missing or unusable source is named before the output
    make_out_dir(options.prefix)
    paths = OutputPaths.for_plan(plan, list_file=options.list_file, format=options.format)
    settings = options.journal_json()
    fp = fingerprint(plan, settings)
    same_plan = paths.journal_matches(fp)
    if not options.overwrite and not same_plan:
        paths.refuse_existing()
    check_listing_rejects(options, plan, paths)
    resuming = options.resume and same_plan and not paths.committed_some()
    if not resuming:
        paths.start_journal(fp, settings)
    shards = ShardWriters(paths, plan.writer_schema, resume=resuming)
    tally = Tally(plan.scan, plan.items)
    kept_rows: list[RecordRow] | None = None
    start = 0
    if resuming:
        resumed = _resume(options, plan, paths, shards, tally)
        if resumed is None:  # the partials do not hold a run of whole records: start over
            shards.abort(keep_partial=False)
            paths.start_journal(fp, settings)
            shards = ShardWriters(paths, plan.writer_schema, resume=False)
            tally = Tally(plan.scan, plan.items)
            resuming = False
        else:
            start, kept_rows = resumed
    rejects = RejectLog(paths.rej_journal, tally.item_rejects if resuming else None)
    records = RecordLog(paths.rec_journal, kept_rows)
    what = "convert" if options.convert else "pack"
    bar = make_progress(len(plan.items), what, unit="img", enabled=options.progress)
    bar.update(start)
    run = _Run(options, plan, paths, shards, tally, rejects, records, bar)
    return run.go(start, n_workers, t0)


def _resume(
    options: PackOptions, plan: Plan, paths: OutputPaths, shards: ShardWriters, tally: Tally
) -> tuple[int, list[RecordRow]] | None:
    """Take over the records and rejects an interrupted run of this plan decided; the first
    position still to do, and the records journal's rows of the records kept. ``None`` when
    a position before the last one kept is neither kept nor journalled as a reject (the
    partials are not one run of whole records): the run must start over."""
    by_key = plan.from_lst or plan.reader is not None
    pos_of_key = {k: i for i, k in enumerate(plan.keys.tolist())} if by_key else None
    last = -1
    for s in range(len(paths.shard_ids)):
        kw = shards.get(s).keys_written
        pos = kw if pos_of_key is None else np.asarray([pos_of_key[k] for k in kw.tolist()])
        if len(pos):
            tally.written[pos.astype(np.int64)] = True
            last = max(last, int(pos.max()))
    start = last + 1
    tally.resumed = tally.n_written
    decided = tally.written[:start].copy()
    for pos, reason, detail in read_reject_journal(paths.rej_journal):
        if pos < start:
            tally.item_rejects.append((pos, reason, detail))
            decided[pos] = True
    if not decided.all():
        return None
    rows = read_record_journal(paths.rec_journal)
    kept_pos = np.flatnonzero(tally.written).tolist()
    kept = [rows.get(pos) or _recount(options, plan, pos) for pos in kept_pos]
    for _, fmt, rotated, passthrough, size_in in kept:
        tally.count(fmt, rotated, passthrough, size_in)
        tally.resumed_bytes_in += size_in
    return start, kept


def _recount(options: PackOptions, plan: Plan, pos: int) -> RecordRow:
    """The records-journal row of a kept record whose line was lost: its file checked again
    (what a worker did for it; the fingerprint vouches that path and options are the same)."""
    r = process(plan.items[pos].path, options)
    if r[0] == 0:
        return (int(pos), r[2], bool(r[3]), bool(r[4]), int(r[5]))
    return (int(pos), "unknown", False, False, 0)  # the file changed since: count what we can


@dataclass
class _Run:
    """The main process's side of one run: store each result in record order, journal each
    reject, then commit every output."""

    options: PackOptions
    plan: Plan
    paths: OutputPaths
    shards: ShardWriters
    tally: Tally
    rejects: RejectLog
    records: RecordLog
    bar: Progress
    #: a convert's largest row count or byte length of each variable field written
    lengths: dict[str, int] = field(default_factory=dict)

    def go(self, start: int, n_workers: int, t0: float) -> PackReport:
        """Collect the workers' results from ``start`` on and commit; on failure keep the
        partials for a resume, or remove them after a write error."""
        committed = False
        chunk = max(1, min(64, len(self.plan.items) // (n_workers * 8) or 1))
        last_flush = time.monotonic()
        upright = self.plan.schema is not None and geometric(self.plan.schema)
        stream = results(
            self.plan.items,
            start,
            self.options,
            n_workers,
            chunk,
            upright=upright,
        )
        try:
            for pos, r in stream:
                self._take(pos, r)
                now = time.monotonic()
                if now - last_flush > _FLUSH_EVERY_S:
                    last_flush = now
                    self.records.flush()  # first: a kept record's line is then there, mostly
                    self.shards.flush()
            self.bar.close()
            self.rejects.close()
            self.records.close()
            self.tally.check_accounting()  # before anything is committed: never a short set
            entries, bytes_out = self._commit()
            committed = True
            for journal in (self.paths.rec_journal, self.paths.journal):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(journal)
            return self.tally.report(
                shards=shard_main_files(self.paths, entries),
                bytes_out=bytes_out,
                seconds=time.perf_counter() - t0,
                manifest=self.paths.manifest,
                rejects_path=self.paths.rejects,
                list_path=self.paths.lst,
                format=self.options.format,
                action="converted" if self.options.convert else "packed",
            )
        except WriteFailed as e:
            self.shards.abort(keep_partial=False)
            remove_partials(self.paths)
            raise e.error from None
        except BaseException:
            if not committed:
                with contextlib.suppress(Exception):
                    self.records.flush()  # before the shards' last bytes, as in the loop
                self.shards.abort(keep_partial=True)
            raise
        finally:
            stream.close()  # stops and joins the workers if we leave early
            self.bar.close()
            with contextlib.suppress(Exception):
                self.rejects.close()
            with contextlib.suppress(Exception):
                self.records.close()

    def _take(self, pos: int, r: tuple) -> None:
        """Store one worker result, or journal it as a reject."""
        if r[0] == 0:
            key, data, label, fields = sample_of(self.plan, pos, r)
            try:
                self.shards.write(self.plan.shard_of(pos), key, data, label, fields)
            except Unstorable as e:
                r = (1, "unstorable", str(e))
            else:
                _, _, fmt, rotated, passthrough, size_in = r[:6]
                self.tally.wrote(pos, fmt, rotated, passthrough, size_in)
                self.records.add(pos, fmt, rotated, passthrough, size_in)
        if r[0] == 1:
            self._reject(pos, r[1], reject_detail(self.plan, pos, r[2]))
        self.bar.update(1)

    def _reject(self, pos: int, reason: str, detail: str) -> None:
        """Journal a reject; past ``max_rejects``, write the rejects list and stop."""
        self.tally.item_rejects.append((pos, reason, detail))
        self.rejects.add(pos, reason, detail)
        n_rej = self.tally.n_rejected
        self.bar.set_postfix_str(f"rejected {n_rej}")
        max_rejects = self.options.max_rejects
        if self.options.layout == "insightface":  # an identity's range has no gaps
            max_rejects = 0
        if max_rejects is not None and n_rej > max_rejects:
            self.rejects.close()
            write_rejects(self.paths.rejects, self.plan.scan, self.plan, self.tally.item_rejects)
            why = f"more than max_rejects={max_rejects}"
            if self.options.layout == "insightface":
                why = "an insightface layout keeps every image (an identity's range has no gaps)"
            raise TooManyRejectsError(
                f"{n_rej} files rejected, {why}; "
                f"see {self.paths.rejects} (partial output kept; rerun to resume)"
            )

    def _commit(self) -> tuple[list[dict], int]:
        """Commit the shards, then the lists, then the manifest (last); the shards' manifest
        entries and the bytes they hold."""
        self.paths.mark_committing()
        if self.options.layout != "plain":  # every item was written: no reject is let through
            labels = np.asarray([float(it.label) for it in self.plan.items])  # type: ignore[arg-type]
            self.shards.write_layout(self.options.layout, labels)
        entries, bytes_out = self.shards.commit()
        write_set_files(self.options, self.plan, self.paths, self.tally, entries, self.lengths)
        return entries, bytes_out


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    format: str = "recordio",
    source_format: str | None = None,
    source_options: dict[str, Any] | None = None,
    workers: int | None = None,
    shard_size: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    overwrite: bool = False,
    resume: bool = True,
    max_rejects: int | None = None,
    progress: bool | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PackReport:
    """Copy every sample of the data set ``src`` (anything ``stoker.formats.open`` reads: a
    ``.rec`` with or without a manifest, MXNet's and insightface's included, TFRecord files,
    WebDataset ``.tar`` shards, an LMDB folder, a ``*.stoker.json`` manifest;
    ``source_format`` names the format when the path cannot, ``source_options`` go to its
    reader: an LSUN-style LMDB's ``label=`` or ``labels=``, say) into a set of ``format`` under
    the prefix ``out``: the image bytes, labels, keys and stored fields exactly as the source
    holds them, in its order (``shuffle``/``seed``: a seeded order).

    It is a pack whose items are the source's positions: the same workers, shards
    (``shard_size``), resume of an interrupted run, ``*.partial`` outputs renamed at the end,
    manifest written last, and rejects: a record that fails to read is listed in
    ``OUT.rejects.tsv`` with its key, file and byte offset, and counts against
    ``max_rejects``; ``engine="ray"`` (``ray_address``) and an ``out`` URL
    (``storage_options``: how it is reached) as for :func:`pack`; the plan, shard-job and
    finalize steps take ``convert=True`` (``docs/scale.md``). Returns the run's
    :class:`PackReport`.
    """
    options = PackOptions(
        src,
        out,
        workers=workers,
        shuffle=shuffle,
        seed=seed,
        shard_size=shard_size,
        overwrite=overwrite,
        resume=resume,
        max_rejects=max_rejects,
        progress=progress,
        format=format,
        convert=True,
        source_format=source_format,
        source_options=source_options,
        engine=engine,
        ray_address=ray_address,
    )
    return run_pack(options, storage_options=storage_options)
