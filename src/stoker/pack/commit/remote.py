"""Packing into object storage: ``stoker pack SRC s3://bucket/sets/train``.

The destination ``destination.Url``: every engine (the local pool, Ray, the step commands)
writes a URL OUT through these functions, shard by shard. The manifest is the commit point: a
reader that finds it finds every shard it names, whole (an object store's PUT is atomic, and
nothing names a shard before the manifest is written). An existing manifest at the URL is
refused unless ``overwrite`` (as locally).

Shard jobs
    :func:`shard_to_url` packs one shard into the staging folder of the machine it runs on
    (``<cache>/staging/<hash of the URL>/``, under a lock there), uploads the shard's files, then its side-car
    ``OUT-NNNNN.pack-shard.json`` with the size, CRC32C and MD5 of each file: the side-car is
    the shard's commit point at the URL. Then the staged copy is removed (its empty lock file
    stays). A shard whose side-car at the URL is of this plan and whose objects hold the
    bytes it names is done: a rerun skips it. :func:`finalize_url` checks every shard so,
    merges the side-cars, writes the rejects list, the ``.lst`` and the manifest in the
    staging folder of its own machine, uploads them (the manifest last) and removes the
    side-cars at the URL. No step needs a filesystem shared between machines.

Whether an object holds a file's bytes
    Its size (one LIST per folder), then, without downloading: an S3 ETag equal to the MD5
    (a single-part upload, no KMS), or a GCS ``crc32c`` equal to the CRC32C. Only when neither
    says yes is the object downloaded and its CRC32C computed. A rerun after an interrupted
    upload keeps each object that holds the local file's bytes and uploads the rest.

Credentials come from the standard places or ``storage_options`` (never written into the
manifest, a plan, a side-car, the report or the progress line).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from stoker._core.atomic import atomic_write
from stoker._core.cache import cache_dir
from stoker._core.checksum import file_crc32c_md5, stream_crc32c
from stoker._core.errors import OutputExistsError, TooManyRejectsError
from stoker._core.progress import Progress
from stoker.formats.manifest import MANIFEST_SUFFIX
from stoker.pack.commit.setfiles import commit_set, make_out_dir, not_ready
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.plan import Plan
from stoker.pack.run.report import PackReport
from stoker.pack.run.shardjob import (
    ShardOutcome,
    lock_path,
    output_paths,
    parse_sidecar,
    read_sidecar,
    run_shard,
    shard_bounds,
    shard_lock,
    sidecar_path,
)
from stoker.storage.remote import Remote
from stoker.storage.urls import check_url, redact

if TYPE_CHECKING:
    from stoker.pack.run.pool import Pool

__all__ = [
    "finalize_url",
    "forget_url",
    "refuse_existing_url",
    "shard_to_url",
    "staged",
    "staging_prefix",
]

#: The most bytes a shard's side-car may have at the URL (a record is about 40 bytes in it).
_MAX_SIDECAR = 256 << 20


def staging_prefix(url: str) -> str:
    """The local prefix a pack to ``url`` is staged under (stable across reruns)."""
    digest = hashlib.sha256(redact(url).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), "staging", digest, url.rstrip("/").rsplit("/", 1)[-1])


def _folder_url(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[0]


def _holds(
    remote: Remote, url: str, size: int, crc: int, md5: str | None, present: Mapping[str, int]
) -> bool:
    """Whether the object at ``url`` holds the ``size`` bytes whose CRC32C is ``crc`` (see
    the module docstring: the listing's size, then the ETag or GCS CRC, else a download)."""
    if present.get(url.rsplit("/", 1)[-1]) != size:
        return False
    try:
        info = remote.fs().info(url)  # from the listing just made, mostly
    except Exception:  # noqa: BLE001 - no cheap answer: download and check
        info = {}
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"').lower()
    if md5 and etag == md5:
        return True
    if info.get("crc32c") == base64.b64encode(crc.to_bytes(4, "big")).decode():
        return True
    with tempfile.TemporaryFile() as tmp:
        remote.download(url, tmp, size=size, what="checking an uploaded file")
        tmp.seek(0)
        return stream_crc32c(tmp) == crc


def _present(remote: Remote, url: str) -> dict[str, int]:
    """Name -> size of the objects in the folder of the prefix ``url`` (one LIST)."""
    folder = _folder_url(url)
    if not remote.exists(folder):
        return {}
    # an object the listing gives no size is not known to hold the file: it is uploaded again
    return {k: v for k, v in remote.listing(folder).items() if v is not None}


def refuse_existing_url(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`OutputExistsError` when a set's manifest is at the prefix ``url``."""
    manifest_url = check_url(url) + MANIFEST_SUFFIX
    if Remote(url, storage_options).exists(manifest_url):
        raise OutputExistsError(
            f"{redact(manifest_url)} exists; pass overwrite=True (--overwrite) to replace the set"
        )


def _at_url(report: PackReport, prefix: str, url: str) -> PackReport:
    """The report with the staged paths replaced by their URLs."""
    folder = _folder_url(url)

    def at(path: str) -> str:
        return redact(f"{folder}/{os.path.basename(path)}") if path.startswith(prefix) else path

    return report.moved(at)


# ---------------------------------------------------------------- shard jobs to a URL
def staged(options: PackOptions, plan: Plan) -> tuple[PackOptions, Plan]:
    """``options`` and ``plan`` pointed at this machine's staging prefix for their URL."""
    prefix = staging_prefix(check_url(options.prefix))
    os.makedirs(os.path.dirname(prefix), mode=0o700, exist_ok=True)
    return dataclasses.replace(options, out=prefix), dataclasses.replace(plan, prefix=prefix)


def _problem(
    remote: Remote,
    url: str,
    fp: str,
    s: int,
    side_name: str,
    present: Mapping[str, int],
    sides: dict[int, dict] | None = None,
) -> str | None:
    """Why shard ``s`` is not done at the URL (``None``: it is, and its side-car goes into
    ``sides``)."""
    folder = _folder_url(url)
    side_url = f"{folder}/{side_name}"
    if side_name not in present:
        return f"not packed ({redact(side_url)} is missing)"
    try:
        side = parse_sidecar(remote.read_bytes(side_url, max_bytes=_MAX_SIDECAR))
    except FileNotFoundError:
        return f"not packed ({redact(side_url)} is missing)"
    if side is None or side.get("fingerprint") != fp or side.get("shard") != s:
        return f"packed from another plan ({redact(side_url)})"
    sums = side.get("sums") or {}
    for name, size in (side.get("files") or {}).items():
        target = f"{folder}/{name}"
        if name not in present:
            return f"{redact(target)} is missing"
        if present[name] != size:
            return f"{redact(target)} is {present[name]} bytes, the shard job wrote {size}"
        crc, md5 = (sums.get(name) or [None, None])[:2]
        if not isinstance(crc, int):
            return f"{redact(side_url)} has no CRC32C for {name}"
        if not _holds(remote, target, size, crc, md5, present):
            return f"{redact(target)} does not hold the bytes the shard job wrote (CRC32C)"
    if sides is not None:
        sides[s] = side
    return None


def shard_to_url(
    options: PackOptions,
    plan: Plan,
    fp: str,
    s: int,
    *,
    pool: Pool | None = None,
    bar: Progress | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> ShardOutcome:
    """Shard ``s`` of a plan whose OUT is a URL: staged here, uploaded, side-car last (see
    the module docstring); skipped when it is done at the URL."""
    t0 = time.perf_counter()
    url = check_url(options.prefix)
    remote = Remote(url, storage_options)
    local_options, local_plan = staged(options, plan)
    paths = output_paths(local_options, local_plan)
    side_path = sidecar_path(paths, s)
    side_name = os.path.basename(side_path)
    with shard_lock(lock_path(paths, s)):
        present = _present(remote, url)
        if _problem(remote, url, fp, s, side_name, present) is None:
            a, b = shard_bounds(plan, s)
            if bar is not None:
                bar.update(b - a)
            return ShardOutcome(s, True, b - a, 0, 0, time.perf_counter() - t0)
        # skipped here too when it was packed here before and its upload was cut short
        got = run_shard(local_options, local_plan, fp, s, pool=pool, bar=bar, lock=False)
        side = read_sidecar(side_path)
        assert side is not None  # run_shard wrote or checked it
        folder = os.path.dirname(side_path)
        sums: dict[str, list] = {}
        for name, size in side["files"].items():
            local = os.path.join(folder, name)
            crc, md5 = sums[name] = list(file_crc32c_md5(local))
            target = f"{_folder_url(url)}/{name}"
            if not _holds(remote, target, size, crc, md5, present):
                remote.upload(local, target)
        with atomic_write(side_path + ".upload", "w") as f:
            json.dump({**side, "sums": sums}, f)
        remote.upload(side_path + ".upload", f"{_folder_url(url)}/{side_name}")  # commit point
        for name in [*side["files"], side_name, side_name + ".upload"]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
    return dataclasses.replace(got, skipped=False, seconds=time.perf_counter() - t0)


def forget_url(
    options: PackOptions, plan: Plan, storage_options: Mapping[str, Any] | None = None
) -> None:
    """Remove every shard's side-car at the URL and here: each shard is then packed again."""
    url = check_url(options.prefix)
    remote = Remote(url, storage_options)
    local_options, local_plan = staged(options, plan)
    paths = output_paths(local_options, local_plan)
    present = _present(remote, url)
    for s in range(plan.n_shards):
        side_path = sidecar_path(paths, s)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(side_path)
        if os.path.basename(side_path) in present:
            remote.remove(f"{_folder_url(url)}/{os.path.basename(side_path)}")


def finalize_url(
    options: PackOptions,
    plan: Plan,
    fp: str,
    t0: float,
    *,
    storage_options: Mapping[str, Any] | None = None,
    resumed: Iterable[int] = (),
) -> PackReport:
    """``setfiles.finalize`` for a URL OUT (see the module docstring): every shard's objects
    checked, the set's files written in the staging folder here and uploaded, the manifest
    last; the side-cars at the URL removed after it."""
    url = check_url(options.prefix)
    remote = Remote(url, storage_options)
    folder = _folder_url(url)
    local_options, local_plan = staged(options, plan)
    make_out_dir(local_options.prefix)
    paths = output_paths(local_options, local_plan)
    present = _present(remote, url)
    sides: dict[int, dict] = {}
    names = [os.path.basename(sidecar_path(paths, s)) for s in range(plan.n_shards)]
    not_ready(
        plan,
        [(s, _problem(remote, url, fp, s, names[s], present, sides)) for s in range(plan.n_shards)],
    )
    merged = [sides[s] for s in range(plan.n_shards)]
    try:
        report = commit_set(local_options, local_plan, merged, t0, resumed=resumed)
    except TooManyRejectsError as e:
        at = f"{folder}/{os.path.basename(paths.rejects)}"
        remote.upload(paths.rejects, at)
        raise TooManyRejectsError(str(e).replace(paths.rejects, redact(at))) from None
    for path in (paths.rejects, paths.lst):
        if path is not None:
            remote.upload(path, f"{folder}/{os.path.basename(path)}")
    remote.upload(paths.manifest, url + MANIFEST_SUFFIX)  # last: the commit point
    for name in names:
        remote.remove(f"{folder}/{name}")
    shutil.rmtree(os.path.dirname(local_options.prefix), ignore_errors=True)
    return _at_url(report, local_options.prefix, url)
