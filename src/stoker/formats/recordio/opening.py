"""Opening records by any of their names (``.rec``, ``.idx``, ``NAME.stoker.json``) as the fitting reader.

A manifest of several shards gives a ``RecordSet``; anything else a ``RecordFile``, with the
manifest that names it (given, or ``NAME.stoker.json`` beside the ``.rec``) attached.
"""

from __future__ import annotations

import os

from stoker.formats.recordio.insightface import with_layout
from stoker.formats.recordio.manifest import (
    MANIFEST_SUFFIX,
    class_names,
    load_manifest,
    shard_paths,
)
from stoker.formats.recordio.paths import default_crc_path, manifest_path_for
from stoker.formats.recordio.reader import Checksums, RecordFile
from stoker.formats.recordio.recordset import RecordSet, open_shard, precheck_shards
from stoker.formats.remote import RemoteFiles, RemoteOptions, local_path, redact, remote_url

__all__ = ["open_records"]


def _with_manifest(r: RecordFile, manifest: dict) -> RecordFile:
    r.manifest, r.class_names = manifest, class_names(manifest)
    return _with_layout(r)


def _with_layout(r: RecordFile) -> RecordFile:
    """``r`` with insightface's layout recognised (closed when its layout is malformed)."""
    try:
        return with_layout(r)
    except BaseException:
        r.close()
        raise


def open_records(
    path: str | os.PathLike[str],
    *,
    verify_checksums: Checksums = False,
    cache: bool = True,
    remote: RemoteOptions | None = None,
) -> RecordFile | RecordSet:
    """Open a ``.rec``, its ``.idx``, or a ``NAME.stoker.json`` manifest.

    A manifest with one shard (or a ``.rec`` with ``NAME.stoker.json`` beside it) gives a
    :class:`RecordFile` with ``class_names`` and ``manifest`` set; several shards give a
    :class:`RecordSet`. Both keep the ``Records`` contract (``shards``, ``manifest``,
    ``class_names``, the insightface attributes; see ``records.py``). The files are checked
    against the manifest (``.rec`` size, ``.idx`` sha256, record count): a mismatch raises
    :class:`ManifestError`. ``verify_checksums`` checks each read against the CRC32C side
    file: ``True`` requires it, ``"auto"`` uses it when it exists (a ``.crc32c`` a manifest
    names must exist: :class:`ManifestError` otherwise), ``False`` ignores it. A ``.crc32c``
    whose size is not 4 bytes per record is an error at open. A single file with insightface's
    layout is an :class:`~stoker.formats.recordio.insightface.InsightfaceFile`
    (``identity_ranges``, ``image_keys``, ``images()``); a malformed layout is an error here.

    ``path`` may be a URL: ``file://`` reads in place; ``s3://``, ``gs://``, ``az://`` and
    ``http(s)://`` name a manifest read through the shard cache (``remote``: its options;
    :mod:`stoker.formats.remote`), always as a :class:`RecordSet`.
    """
    p = os.fspath(path)
    url = remote_url(p)
    if url is not None:
        if not url.endswith(MANIFEST_SUFFIX):
            raise ValueError(
                f"{redact(url)}: a RecordIO set in object storage is opened by its manifest "
                f"(NAME{MANIFEST_SUFFIX}, which `stoker pack` writes beside the shards)"
            )
        files = RemoteFiles(url, remote)
        return RecordSet(url, verify_checksums=verify_checksums, cache=cache, files=files)
    p = local_path(p)
    kw = {"verify_checksums": verify_checksums, "cache": cache}
    if p.endswith(MANIFEST_SUFFIX):
        manifest = load_manifest(p)
        precheck_shards(p, manifest, verify_checksums)
        if len(manifest["shards"]) != 1:
            return RecordSet(p, verify_checksums=verify_checksums, cache=cache)
        return _with_manifest(open_shard(p, manifest["shards"][0], **kw), manifest)
    if p.endswith(".idx"):
        rec = p[:-4] + ".rec"
        if not os.path.exists(rec):
            raise FileNotFoundError(f"{p}: no {os.path.basename(rec)} beside it")
        idx: str | None = p
        p = rec
    else:
        idx = None
    mpath = manifest_path_for(p)
    if os.path.exists(mpath):
        manifest = load_manifest(mpath)
        me = os.path.abspath(p)
        for shard in manifest["shards"]:
            if os.path.abspath(shard_paths(mpath, shard)[0]) == me:
                precheck_shards(mpath, {"shards": [shard]}, verify_checksums)
                return _with_manifest(open_shard(mpath, shard, **kw), manifest)
    crc = default_crc_path(p)
    return _with_layout(
        RecordFile(
            p,
            idx,
            crc_path=crc if os.path.exists(crc) else None,
            **kw,  # type: ignore[arg-type]
        )
    )
