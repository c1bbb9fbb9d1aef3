"""The walk of ``stoker verify`` over a set made of shards, for every format: :func:`verify_set`
resolves what a path names as the loader does (a URL, a manifest, a bare shard that its sibling
manifest lists, a bare file) and hands each shard's files to the format's walk.

A set in object storage is verified by its manifest's URL, each shard downloaded afresh and
walked as a local shard is.

A copy already in the node's shard cache is not trusted to be what storage holds now (the
object may have changed since it was cached), so each shard is downloaded again: through a
:class:`~stoker.storage.ShardCache` of its own, a folder ``verify-PID-RAND`` inside the cache
folder with the cache's budget, which holds one shard at a time (emptied after each, removed at
the end; one a killed run left is removed by the next: :func:`fresh_files`). So a set larger
than the budget verifies, and the downloads are atomic as every cache download is. Problems
name each shard's URL (without credentials), never a local copy (:func:`relabel`).

:func:`verify_shards` is the walk for a format whose shards are whole files (TFRecord's
``.tfrecord``, WebDataset's ``.tar``, RecordIO's ``.rec`` with its ``.idx``): the format gives
the function that checks one manifest entry against its local files, as its local verify does
(size, checksums, every record).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from dataclasses import replace

from stoker._core.errors import ManifestError
from stoker._core.progress import make_progress
from stoker.formats.manifest import MANIFEST_SUFFIX, load, parse, read_json, shard_file
from stoker.formats.opening import cache_url, open_set
from stoker.formats.remote import RemoteFiles, RemoteOptions, local_path, redact, remote_url
from stoker.formats.report import Problem, VerifyReport
from stoker.formats.shards import ShardEntry

__all__ = [
    "RemoteOptions",
    "fresh_files",
    "relabel",
    "verify_at",
    "verify_set",
    "verify_shards",
]

#: ``entry(report, local paths by role, entry, manifest)``: a format's walk of one shard.
VerifyEntry = Callable[[VerifyReport, dict[str, str], ShardEntry, dict], None]


def verify_at(
    path: str | os.PathLike[str],
    kind: str,
    *,
    local: Callable[[str], VerifyReport],
    entry: VerifyEntry,
    max_problems: int,
    remote: RemoteOptions | None = None,
    local_only: str = "",
) -> VerifyReport:
    """A format's own walk of a local set (``local(path)``, a ``file://`` URL as its path), or
    :func:`verify_shards` of a URL with the format's shard walk ``entry``; ``local_only``:
    why a URL is refused with the options given (empty: it is not)."""
    p = local_path(os.fspath(path))
    url = _url(p, kind)
    if url is None:
        return local(p)
    if local_only:
        raise ValueError(local_only)
    return verify_shards(
        url, remote=remote, kind=kind, verify_entry=entry, max_problems=max_problems
    )


def _url(p: str, kind: str) -> str | None:
    """What the set at ``p`` is verified through by :func:`verify_shards`: a URL, or a local
    manifest naming files on other storage (as a ``file://`` URL); ``None`` for a local set."""
    url = remote_url(p)
    if url is None and p.endswith(MANIFEST_SUFFIX):
        with contextlib.suppress(ManifestError, OSError):  # the local walk names what is wrong
            return cache_url(p, load(p, kind=kind)["shards"])
    return url


def verify_set(
    path: str | os.PathLike[str],
    kind: str,
    *,
    entry: VerifyEntry,
    bare: Callable[[VerifyReport, str], None],
    max_problems: int,
    progress: bool | None = None,
    remote: RemoteOptions | None = None,
    sibling: bool = True,
) -> VerifyReport:
    """Verify the ``kind`` set at ``path`` as the loader opens it: a URL through
    :func:`verify_shards`; a manifest's shards, or the one entry of a bare shard that its
    sibling manifest lists (``sibling``), each through ``entry``; any other file through
    ``bare(report, path)``. A shard the manifest lists that is not there is a problem; an
    unreadable manifest raises ``ManifestError``."""
    if max_problems < 0:
        raise ValueError(f"max_problems must be >= 0, got {max_problems}")
    p = os.fspath(path)
    if (url := _url(local_path(p), kind)) is not None:
        return verify_shards(
            url, remote=remote, kind=kind, verify_entry=entry, max_problems=max_problems
        )
    report = VerifyReport(p, max_problems=max_problems)
    src = open_set(p, kind, sibling=sibling)
    if src.manifest is None:
        bare(report, src.path)
        return report
    where = str(src.manifest_path)
    many = len(src.entries) > 1
    bar = make_progress(
        len(src.entries), "verify", unit="shard", enabled=progress if many else False
    )
    try:
        for s in src.entries:
            local = {r: str(shard_file(where, s, r)) for r in s.files}
            if not os.path.isfile(local["data"]):
                why = f"the shard {where} lists does not exist"
                report.add(Problem(local["data"], None, None, why))
                continue
            entry(report, local, s, src.manifest)
            bar.update(1)
    finally:
        bar.close()
    return report


@contextlib.contextmanager
def fresh_files(url: str, remote: RemoteOptions | None) -> Iterator[RemoteFiles]:
    """The set at ``url`` seen through a shard cache of its own (see the module docstring),
    removed on exit."""
    options = remote or RemoteOptions()
    base = options.cache()
    root = os.path.join(base.root, f"verify-{os.getpid()}-{secrets.token_hex(4)}")
    _sweep(base.root)
    try:
        yield RemoteFiles(url, replace(options, cache_dir=root, cache_limit=base.limit))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _sweep(folder: str) -> None:
    """Remove the ``verify-PID-*`` folders of processes that are gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            parts = name.split("-")
            if len(parts) != 3 or parts[0] != "verify" or not parts[1].isdigit():
                continue
            try:
                os.kill(int(parts[1]), 0)
            except ProcessLookupError:
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
            except OSError:
                pass  # alive, another user's


def relabel(report: VerifyReport, n0: int, m0: int, names: dict[str, str]) -> None:
    """The problems and notes from ``n0``/``m0`` on with each cached copy's path replaced by
    the URL it was fetched from."""

    def sub(text: str) -> str:
        for local, url in names.items():
            text = text.replace(local, url)
        return text

    report.problems[n0:] = [
        replace(p, path=sub(p.path), reason=sub(p.reason)) for p in report.problems[n0:]
    ]
    report.notes[m0:] = [sub(n) for n in report.notes[m0:]]


def verify_shards(
    url: str,
    *,
    remote: RemoteOptions | None,
    kind: str,
    verify_entry: VerifyEntry,
    max_problems: int,
) -> VerifyReport:
    """Verify the ``kind`` set whose manifest is at ``url``, one whole-file shard (its data
        file and side-cars) at a time: ``verify_entry(report, local_paths_by_role, entry,
        manifest)`` checks the entry against its downloaded copies (as the format's local verify
        does; a side-car that is not there is handed over as a local path that is not there, for the
    walk to report as a local one). A shard that is not there is a problem naming its URL. Raises what stops the whole walk: an unreadable or hostile
        manifest, storage that cannot be reached, a shard larger than the cache's budget."""
    if max_problems < 0:
        raise ValueError(f"max_problems must be >= 0, got {max_problems}")
    with fresh_files(url, remote) as files:
        shown = redact(files.url)
        report = VerifyReport(shown, max_problems=max_problems)
        m = parse(read_json(files.manifest_copy()), shown, kind)
        urls = [
            {r: files.url_of(n, f"shards[{j}].files.{r}") for r, n in s.files.items()}
            for j, s in enumerate(m["shards"])
        ]
        # files.sizes: what exists (one listing per folder, or a HEAD each over HTTP)
        files.list_sizes([u for e in urls for u in e.values()], missing_ok=True)
        for j, (entry, roles) in enumerate(zip(m["shards"], urls, strict=True)):
            if roles["data"] not in files.sizes:
                report.add(
                    Problem(
                        redact(roles["data"]), None, None, "shard listed in the manifest is missing"
                    )
                )
                continue
            n0, m0 = len(report.problems), len(report.notes)
            with contextlib.ExitStack() as pins:
                local = {  # a side-car not there: a path not there, which the walk reports
                    r: pins.enter_context(files.fetch(u, what=f"shard {j} {r}")).path
                    if u in files.sizes
                    else os.path.join(files.cache.root, f"{j}-{r}-missing")
                    for r, u in roles.items()
                }
                verify_entry(report, local, entry, m)
            relabel(report, n0, m0, {local[r]: redact(u) for r, u in roles.items()})
            files.cache.clear()  # one shard at a time
    return report
