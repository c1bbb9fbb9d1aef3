"""Every file a run writes: the shards, the journal, the rejects list, the ``.lst`` and the
manifest.

A shard is written as ``*.partial`` files (each format's
:class:`~stoker.formats.base.ShardWriter` keeps its own until its ``commit``) and renamed into
place when it is whole; the shard job then commits it with its side-car (``shardjob.py``).
The set's files, ``.rejects.tsv``, ``.lst`` and ``.stoker.json`` (last), are written at
finalize. The journal ``OUT.pack-journal.partial`` holds the plan's fingerprint: a rerun of
the same plan keeps the shards that are done. A write error (ENOSPC, EFBIG) becomes a
:class:`WriteFailed` that names the output path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker._core.atomic import atomic_write
from stoker._core.errors import OutputExistsError, PackError
from stoker._core.schema import Schema
from stoker.formats.registry import DEFAULT as DEFAULT_FORMAT
from stoker.formats.registry import get
from stoker.pack.plan.plan import Plan
from stoker.pack.plan.scan import ScanResult, escape_name
from stoker.pack.plan.source import SourceItems

__all__ = [
    "OutputPaths",
    "ShardWriters",
    "Unstorable",
    "WriteFailed",
    "class_counts",
    "remove_partials",
    "write_error",
    "write_lst",
    "shard_main_files",
    "write_manifest",
    "write_rejects",
]


def _outputs_like(prefix: str, suffixes: tuple[str, ...]) -> list[str]:
    """Files in the output folder named ``PREFIX[-N...]`` + one of ``suffixes``: where a
    format's shards live (``PREFIX.tar``, ``PREFIX-00003.tfrecord``, their side files)."""
    folder = os.path.dirname(os.path.abspath(prefix))
    pat = re.compile(re.escape(os.path.basename(prefix)) + r"(-\d+)*\.")
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(
        os.path.join(folder, n)
        for n in names
        if pat.match(n) and n.lower().endswith(suffixes) and not n.endswith(".stoker.json")
    )


@dataclass(frozen=True)
class OutputPaths:
    """The paths of every output and journal of one run. Shard files are the format's: the
    files named ``PREFIX[-N].ext`` with one of its extensions (``.rec``, ``.tfrecord``, ...)
    or ``.crc32c``."""

    format: str
    prefix: str
    shard_ids: tuple[int | None, ...]
    manifest: str
    rejects: str
    lst: str | None
    journal: str

    @classmethod
    def for_plan(cls, plan: Plan, *, list_file: bool, format: str = DEFAULT_FORMAT) -> OutputPaths:
        p = plan.prefix
        return cls(
            format=format,
            prefix=p,
            shard_ids=tuple(plan.shard_id(s) for s in range(plan.n_shards)),
            manifest=p + ".stoker.json",
            rejects=p + ".rejects.tsv",
            lst=p + ".lst" if list_file else None,
            journal=p + ".pack-journal.partial",
        )

    def shard_files(self) -> list[str]:
        """The final shard files of this run's format (see the class docstring)."""
        fmt = get(self.format)  # a format's shards, then their side files (its roles)
        suffixes = tuple(dict.fromkeys([*fmt.extensions, *fmt.roles.values()]))
        found = _outputs_like(self.prefix, suffixes)
        return sorted(found, key=lambda p: [p.lower().endswith(x) for x in suffixes].index(True))

    def finals(self) -> list[str]:
        """The files a finished run leaves."""
        out = self.shard_files()
        return out + [self.manifest, self.rejects] + ([self.lst] if self.lst else [])

    def journal_matches(self, fp: str) -> bool:
        """Whether a journal says an unfinished run of this very plan left files here."""
        return self._journal().get("fingerprint") == fp

    def _journal(self) -> dict:
        try:
            with open(self.journal) as f:
                got = json.load(f)
        except (OSError, ValueError):
            return {}
        return got if isinstance(got, dict) else {}

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
    for p in (*_outputs_like(paths.prefix, (".partial",)), paths.journal):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


class Unstorable(Exception):
    """A sample the format cannot hold (a writer's ``ValueError``): a reject, not a failure."""


def _where(w: Any) -> str:
    files = getattr(w, "files", None) or ()
    return str(getattr(w, "rec_path", None) or getattr(w, "path", None) or next(iter(files), "?"))


class ShardWriters:
    """One :class:`~stoker.formats.base.ShardWriter` of the run's format per shard, opened on
    first use."""

    def __init__(self, paths: OutputPaths, schema: Schema | None) -> None:
        self.open_writer = get(paths.format).load("writer")
        self.paths = paths
        self.schema = schema
        self.writers: dict[int, Any] = {}

    def get(self, s: int) -> Any:
        w = self.writers.get(s)
        if w is None:
            w = self.open_writer(
                self.paths.prefix, self.paths.shard_ids[s], schema=self.schema, checksums=True
            )
            self.writers[s] = w
        return w

    def write(self, s: int, key: int, image: bytes, label: Any, fields: Any) -> None:
        w = self.get(s)
        try:
            w.write(key, image, label, fields)
        except OSError as e:
            raise write_error(e, _where(w), w.bytes_written) from None
        except ValueError as e:
            raise Unstorable(str(e)) from None

    def write_many(
        self, s: int, keys: list[int], images: list[bytes], labels: list[Any], fields: list[Any]
    ) -> list[tuple[int, str]]:
        """:meth:`write` of each sample in order, through the writer's ``write_many``; the
        ``(index, reason)`` of each the format cannot store (rejects, not failures)."""
        w = self.get(s)
        try:
            return w.write_many(keys, images, labels, fields)
        except OSError as e:
            raise write_error(e, _where(w), w.bytes_written) from None

    def write_layout(self, layout: str, labels: np.ndarray) -> None:
        """Append the records of ``layout`` after the images of the one shard (its writer's
        ``write_layout``: RecordIO's insightface header and identity records)."""
        w = self.get(0)
        write = getattr(w, "write_layout", None)
        if write is None:
            raise PackError(f"{_where(w)}: format {self.paths.format!r} has no layout {layout!r}")
        try:
            write(layout, labels)
        except OSError as e:
            raise write_error(e, _where(w), w.bytes_written) from None
        except ValueError as e:
            raise PackError(str(e)) from None

    def commit_one(self, s: int) -> tuple[dict, tuple[str, ...]]:
        """Rename shard ``s`` alone into place (a shard job); its manifest entry and its
        final files."""
        w = self.get(s)
        try:
            entry = w.commit()
        except OSError as e:
            raise write_error(e, _where(w), w.bytes_written) from None
        files = tuple(getattr(w, "files", None) or (getattr(w, "path", None) or _where(w),))
        return entry, files

    def abort(self) -> None:
        """Close every shard and remove its partial files: a shard that is not whole is
        written again from scratch."""
        for w in self.writers.values():
            w.abort()


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
    items = plan.items
    if (
        isinstance(items, SourceItems)
        and items.labels.ndim == 1
        and items.labels.dtype.kind in "iub"
    ):
        labels = items.labels[written].astype(np.int64)  # a convert in the source's order
        labels = labels[(labels >= 0) & (labels < len(counts))]
        counts += np.bincount(labels, minlength=len(counts)).astype(np.int64)
    else:
        for pos in np.flatnonzero(written).tolist():
            lab = plan.items[pos].label
            if not isinstance(lab, tuple) and 0 <= int(lab) < len(counts):
                counts[int(lab)] += 1
    return {name: int(counts[i]) for name, i in plan.scan.classes.items()}


def write_manifest(
    paths: OutputPaths,
    entries: list[dict],
    classes: dict[str, int],
    pack_meta: dict,
    rejects_meta: dict,
    *,
    schema: Schema | None = None,
) -> None:
    """The manifest (``OUT.stoker.json``) through the format's ``write_set_manifest``, written
    atomically and last; ``schema``: a listing's or a converted set's (a folder's manifest has
    none, and stays as it was)."""
    write_set = get(paths.format).load("manifest")
    write_set(
        paths.manifest,
        entries,
        classes=classes,
        schema=schema,
        pack=pack_meta,
        rejects=rejects_meta,
    )


def shard_main_files(paths: OutputPaths, entries: list[dict]) -> tuple[str, ...]:
    """Each committed shard's data file, as its manifest entry names it (an entry in a
    side-car of an earlier version's run is read in its format's version-1 dialect)."""
    from stoker.formats.manifest import entry_json

    folder = os.path.dirname(os.path.abspath(paths.manifest))
    return tuple(
        os.path.join(
            folder, entry_json(paths.format, e, paths.manifest, f"shards[{j}]")["files"]["data"]
        )
        for j, e in enumerate(entries)
    )
