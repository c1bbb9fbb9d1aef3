"""Packing into object storage: ``stoker pack SRC s3://bucket/sets/train``.

The pack runs as it does locally, into a staging folder in the cache directory
(``<cache>/staging/<hash of the URL>/``, so a rerun finds it and resumes there); then the files
are uploaded under their final names, shards first, and the manifest last. The manifest is the
commit point: a reader that finds it finds every shard it names, whole (an object store's PUT
is atomic, and nothing names a shard before the manifest is written).

A rerun after an interrupted upload checks what is already there: an object with the size the
local file has and the same CRC32C (read back and checked) is kept; anything else is uploaded
again. An existing manifest at the URL is refused unless ``overwrite`` (as locally). The
staging folder is removed once the manifest is up.

Credentials come from the standard places or ``storage_options`` (never written into the
manifest, the report or the progress line).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from stoker._core.cache import cache_dir
from stoker._core.checksum import file_crc32c
from stoker._core.errors import OutputExistsError
from stoker._core.progress import make_progress
from stoker.formats.manifest import MANIFEST_SUFFIX
from stoker.pack.options import PackOptions
from stoker.pack.report import PackReport
from stoker.storage.remote import Remote
from stoker.storage.urls import check_url, redact

__all__ = ["run_remote", "staging_prefix"]


def staging_prefix(url: str) -> str:
    """The local prefix a pack to ``url`` is staged under (stable across reruns)."""
    digest = hashlib.sha256(redact(url).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), "staging", digest, url.rstrip("/").rsplit("/", 1)[-1])


def _folder_url(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def _outputs(prefix: str) -> tuple[list[str], str]:
    """The staged files to upload (everything the pack wrote beside its manifest, partials,
    journals and locks excepted) and the manifest, which goes last."""
    folder, base = os.path.split(prefix)
    manifest = prefix + MANIFEST_SUFFIX
    files = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if path == manifest or not name.startswith(base) or not os.path.isfile(path):
            continue
        rest = name[len(base) :]
        if not rest.startswith((".", "-")) or name.endswith((".partial", ".journal", ".lock")):
            continue
        if ".journal" in name or ".plan" in name:
            continue
        files.append(path)
    return files, manifest


def _same(remote: Remote, url: str, local: str, present: Mapping[str, int]) -> bool:
    """True when the object at ``url`` already holds ``local``'s bytes (size, then CRC32C of
    a read-back copy)."""
    size = os.path.getsize(local)
    if present.get(url.rsplit("/", 1)[-1]) != size:
        return False
    import tempfile

    with tempfile.TemporaryFile() as tmp:
        remote.download(url, tmp, size=size, what="checking an uploaded file")
        tmp.flush()
        tmp.seek(0)
        got = 0
        import crc32c

        while chunk := tmp.read(4 << 20):
            got = crc32c.crc32c(chunk, value=got)
    return got == file_crc32c(local)


def run_remote(
    options: PackOptions,
    run_local: Callable[[PackOptions], PackReport],
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> PackReport:
    """Pack as ``options`` say into the URL ``options.out`` (see the module docstring)."""
    url = check_url(options.prefix)
    remote = Remote(url, storage_options)
    manifest_url = url + MANIFEST_SUFFIX
    if remote.exists(manifest_url) and not options.overwrite:
        raise OutputExistsError(
            f"{redact(manifest_url)} exists; pass overwrite=True (--overwrite) to replace the set"
        )
    prefix = staging_prefix(url)
    os.makedirs(os.path.dirname(prefix), mode=0o700, exist_ok=True)
    report = run_local(dataclasses.replace(options, out=prefix))
    files, manifest = _outputs(prefix)
    folder = _folder_url(url)
    present = remote.listing(folder) if remote.exists(folder) else {}
    bar = make_progress(len(files) + 1, "upload", unit="file", enabled=options.progress)
    try:
        for path in files:
            target = f"{folder}/{os.path.basename(path)}"
            if not _same(remote, target, path, present):
                remote.upload(path, target)
            bar.update(1)
        remote.upload(manifest, manifest_url)  # last: the commit point
        bar.update(1)
    finally:
        bar.close()
    shutil.rmtree(os.path.dirname(prefix), ignore_errors=True)
    return _at_url(report, prefix, url)


def _at_url(report: PackReport, prefix: str, url: str) -> PackReport:
    """The report with the staged paths replaced by their URLs."""

    def at(path: str | None) -> str | None:
        if path is None:
            return None
        folder = _folder_url(url)
        return redact(f"{folder}/{os.path.basename(path)}") if path.startswith(prefix) else path

    return dataclasses.replace(
        report,
        manifest=at(report.manifest) or report.manifest,
        shards=tuple(at(s) or s for s in report.shards),
        rejects_path=at(report.rejects_path) or report.rejects_path,
        list_path=at(report.list_path),
    )
