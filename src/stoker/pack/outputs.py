"""Every file a run writes, kept as ``*.partial`` until the run commits: the shards, the
journals, the rejects list, the ``.lst`` and the manifest.

Every output is renamed into place only when the whole run succeeded: the shards
(``.rec``/``.idx``/``.crc32c``), ``.stoker.json`` (written last), ``.rejects.tsv`` and
``.lst``. The journal ``OUT.pack-journal.partial`` holds the plan's fingerprint,
``OUT.rejects.tsv.partial`` the rejects found so far (one flushed line each) and
``OUT.pack-records.partial`` what each record written so far counts for in the manifest
(source format, rotated, stored as is, bytes read), so that a resumed run's counts cover every
record, not only the ones it wrote itself. A write error
(ENOSPC, EFBIG) becomes a :class:`WriteFailed` that names the output path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._core.atomic import atomic_write, partial_path
from stoker._core.errors import OutputExistsError, PackError
from stoker._core.schema import Schema
from stoker.pack.plan import Plan
from stoker.pack.scan import ScanResult, escape_name, unescape_name

__all__ = [
    "OutputPaths",
    "RecordLog",
    "RecordRow",
    "RejectLog",
    "ShardWriters",
    "WriteFailed",
    "class_counts",
    "read_record_journal",
    "read_reject_journal",
    "remove_partials",
    "write_error",
    "write_lst",
    "write_manifest",
    "write_rejects",
]


def _stem_paths(rec: str) -> tuple[str, str, str]:
    stem = rec[:-4]
    return rec, stem + ".idx", stem + ".crc32c"


@dataclass(frozen=True)
class OutputPaths:
    """The paths of every output and journal of one run."""

    shard_recs: tuple[str, ...]
    manifest: str
    rejects: str
    lst: str | None
    journal: str
    rej_journal: str
    rec_journal: str

    @classmethod
    def for_plan(cls, plan: Plan, *, list_file: bool) -> OutputPaths:
        p = plan.prefix
        return cls(
            shard_recs=tuple(plan.rec_path(s) for s in range(plan.n_shards)),
            manifest=p + ".stoker.json",
            rejects=p + ".rejects.tsv",
            lst=p + ".lst" if list_file else None,
            journal=p + ".pack-journal.partial",
            rej_journal=partial_path(p + ".rejects.tsv"),
            rec_journal=p + ".pack-records.partial",
        )

    def finals(self) -> list[str]:
        """The files a finished run leaves."""
        out = [p for rec in self.shard_recs for p in _stem_paths(rec)]
        return out + [self.manifest, self.rejects] + ([self.lst] if self.lst else [])

    def journal_matches(self, fp: str) -> bool:
        """Whether a journal says an unfinished run of this very plan left files here."""
        if not os.path.exists(self.journal):
            return False
        try:
            with open(self.journal) as f:
                return json.load(f).get("fingerprint") == fp
        except (OSError, ValueError):
            return False

    def refuse_existing(self) -> None:
        """Raise :class:`OutputExistsError` when a finished output is in the way."""
        # a rejects list alone is what a run stopped by max_rejects leaves: not in the way
        existing = [
            p
            for p in self.finals()
            if os.path.exists(p) and (p != self.rejects or os.path.exists(self.manifest))
        ]
        if existing:
            raise OutputExistsError(
                f"{existing[0]} exists ({len(existing)} output file(s) in the way); "
                "pass overwrite=True (--overwrite) to replace them"
            )

    def committed_some(self) -> bool:
        """Whether a run killed while committing has renamed some shards already."""
        return any(
            os.path.exists(rec) and not os.path.exists(partial_path(rec)) for rec in self.shard_recs
        )

    def start_journal(self, fp: str, settings: dict[str, Any]) -> None:
        """Remove the partials of any earlier run and record this plan's fingerprint."""
        remove_partials(self)
        with atomic_write(self.journal, "w") as jf:
            json.dump({"fingerprint": fp, "settings": settings}, jf)


class WriteFailed(Exception):
    """An output could not be written; ``error`` is the :class:`PackError` to raise."""

    def __init__(self, error: PackError) -> None:
        self.error = error
        super().__init__(str(error))


def write_error(e: OSError, path: str, nbytes: int | None) -> WriteFailed:
    """A :class:`WriteFailed` naming ``path``, the bytes written and the likely cause."""
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    done = f" after {nbytes} bytes" if nbytes is not None else ""
    hint = " (disk full?)" if e.errno == errno.ENOSPC else ""
    hint = " (file size limit)" if e.errno == errno.EFBIG else hint
    err = PackError(
        f"writing {path} failed{done}: {name} {e.strerror}{hint}; partial output removed"
    )
    err.__cause__ = e
    return WriteFailed(err)


def remove_partials(paths: OutputPaths) -> None:
    """Remove the partial shards and the journals."""
    for rec in paths.shard_recs:
        for p in _stem_paths(rec):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial_path(p))
    for p in (paths.rej_journal, paths.rec_journal, paths.journal):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


class ShardWriters:
    """One :class:`~stoker.formats.recordio.RecordWriter` per shard, opened on first use."""

    def __init__(self, shard_recs: tuple[str, ...], *, resume: bool) -> None:
        self.shard_recs = shard_recs
        self.resume = resume
        self.writers: dict[int, Any] = {}

    def get(self, s: int) -> Any:
        w = self.writers.get(s)
        if w is None:
            from stoker.formats.recordio import RecordWriter

            w = RecordWriter(self.shard_recs[s], overwrite=True, resume=self.resume, checksums=True)
            self.writers[s] = w
        return w

    def write(self, s: int, key: int, payload: bytes) -> None:
        w = self.get(s)
        try:
            w.write(key, payload)
        except OSError as e:
            raise write_error(e, w.rec_path, w.bytes_written) from None

    def flush(self) -> None:
        """Flush every open shard (bounds the work a kill can lose)."""
        for w in self.writers.values():
            try:
                w.flush()
            except OSError as e:
                raise write_error(e, w.rec_path, w.bytes_written) from None

    def commit(self) -> list:
        """Rename every shard into place; their shard infos, in shard order."""
        infos = []
        for s in range(len(self.shard_recs)):
            w = self.get(s)
            try:
                infos.append(w.commit())
            except OSError as e:
                raise write_error(e, w.rec_path, w.bytes_written) from None
        return infos

    def abort(self, *, keep_partial: bool) -> None:
        """Close every shard: keep the partials for a resume (errors ignored, the first
        failure is what propagates), or remove them (after a write error)."""
        for w in self.writers.values():
            if keep_partial:
                with contextlib.suppress(Exception):
                    w.abort(keep_partial=True)
            else:
                w.abort(keep_partial=False)


def _reject_line(pos: int, reason: str, detail: str) -> str:
    return f"{pos}\t{reason}\t{escape_name(detail)}\n"


def read_reject_journal(path: str) -> list[tuple[int, str, str]]:
    """The ``(position, reason, detail)`` rows of a rejects journal; a torn last line is cut."""
    out = []
    try:
        with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
            for line in f:
                if not line.endswith("\n"):
                    break  # torn last line
                parts = line[:-1].split("\t")
                if len(parts) == 3 and parts[0].isdigit():
                    out.append((int(parts[0]), parts[1], unescape_name(parts[2])))
    except FileNotFoundError:
        pass
    return out


class RejectLog:
    """The rejects journal, open for appending: one flushed line per reject."""

    def __init__(self, path: str, kept: list[tuple[int, str, str]] | None = None) -> None:
        """Open ``path``; with ``kept`` (a resume), first rewrite it to hold exactly those."""
        self.path = path
        if kept is not None:
            with open(path, "w", encoding="utf-8", newline="\n") as f:
                for row in kept:
                    f.write(_reject_line(*row))
        self.f = open(path, "a", encoding="utf-8", newline="\n")  # noqa: SIM115

    def add(self, pos: int, reason: str, detail: str) -> None:
        try:
            self.f.write(_reject_line(pos, reason, detail))
            self.f.flush()
        except OSError as e:
            raise write_error(e, self.path, None) from None

    def close(self) -> None:
        self.f.close()


#: One written record's counts: (position, source format, rotated, stored as is, bytes read).
RecordRow = tuple[int, str, bool, bool, int]


def _record_line(pos: int, fmt: str, rotated: bool, passthrough: bool, size_in: int) -> str:
    return f"{pos}\t{fmt}\t{int(rotated)}\t{int(passthrough)}\t{size_in}\n"


def read_record_journal(path: str) -> dict[int, RecordRow]:
    """The rows of a records journal by position; a torn or malformed line is skipped."""
    out: dict[int, RecordRow] = {}
    try:
        with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
            for line in f:
                parts = line[:-1].split("\t")
                if not line.endswith("\n") or len(parts) != 5:
                    continue
                pos, fmt, rot, thru, size = parts
                if pos.isdigit() and rot in "01" and thru in "01" and size.isdigit():
                    out[int(pos)] = (int(pos), fmt, rot == "1", thru == "1", int(size))
    except FileNotFoundError:
        pass
    return out


class RecordLog:
    """The records journal, open for appending: one line per record written, buffered and
    flushed with the shards (:meth:`flush`). A record whose line a kill lost is checked again
    on resume (see ``packer._resume``)."""

    def __init__(self, path: str, kept: list[RecordRow] | None = None) -> None:
        """Open ``path``; with ``kept`` (a resume), first rewrite it to hold exactly those."""
        self.path = path
        mode = "a"
        if kept is not None:
            mode = "w"
        self.f = open(path, mode, encoding="utf-8", newline="\n")  # noqa: SIM115
        if kept:
            self.f.writelines(_record_line(*row) for row in kept)

    def add(self, pos: int, fmt: str, rotated: bool, passthrough: bool, size_in: int) -> None:
        try:
            self.f.write(_record_line(pos, fmt, rotated, passthrough, size_in))
        except OSError as e:
            raise write_error(e, self.path, None) from None

    def flush(self) -> None:
        try:
            self.f.flush()
        except OSError as e:
            raise write_error(e, self.path, None) from None

    def close(self) -> None:
        self.f.close()


def write_rejects(
    path: str, scan: ScanResult, plan: Plan, item_rejects: list[tuple[int, str, str]]
) -> None:
    """``key path reason detail`` per rejected file (key empty when rejected while listing);
    names escaped (see ``scan.escape_name``)."""
    with atomic_write(path, "w") as f:
        f.write("key\tpath\treason\tdetail\n")
        for rel, reason, detail in scan.rejects:
            f.write(f"\t{escape_name(rel)}\t{reason}\t{escape_name(detail)}\n")
        for pos, reason, detail in sorted(item_rejects):
            rel = plan.items[pos].rel
            f.write(f"{plan.keys[pos]}\t{escape_name(rel)}\t{reason}\t{escape_name(detail)}\n")


def write_lst(path: str, plan: Plan, written: np.ndarray) -> None:
    """im2rec list: ``key \\t label(s) \\t path`` for every record, in record order."""
    with atomic_write(path, "w") as f:
        for pos in np.flatnonzero(written).tolist():
            it = plan.items[pos]
            labels = it.label if isinstance(it.label, tuple) else (it.label,)
            lab = "\t".join(f"{v:f}" for v in labels)
            f.write(f"{plan.keys[pos]}\t{lab}\t{escape_name(it.rel)}\n")


def class_counts(plan: Plan, written: np.ndarray) -> dict[str, int]:
    """Records written per class name (empty for an im2rec list)."""
    if plan.from_lst:
        return {}
    counts = np.zeros(len(plan.scan.classes), dtype=np.int64)
    for pos in np.flatnonzero(written).tolist():
        lab = plan.items[pos].label
        if not isinstance(lab, tuple) and 0 <= int(lab) < len(counts):
            counts[int(lab)] += 1
    return {name: int(counts[i]) for name, i in plan.scan.classes.items()}


def write_manifest(
    path: str,
    shard_infos: list,
    classes: dict[str, int],
    pack_meta: dict,
    rejects_meta: dict,
    *,
    schema: Schema | None = None,
) -> None:
    """The manifest (``OUT.stoker.json``), written atomically; ``schema``: a listing's (a
    folder's manifest has none, and stays as it was)."""
    from stoker.formats import recordio

    shards = [recordio.shard_entry(si, path) for si in shard_infos]
    extra = {} if schema is None else {"schema": schema.to_json()}
    made = recordio.make_manifest(
        shards, classes=classes, pack=pack_meta, rejects=rejects_meta, **extra
    )
    recordio.write_manifest(path, made)
