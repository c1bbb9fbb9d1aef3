"""Opening records by any of their names (``.rec``, ``.idx``, ``NAME.stoker.json``) as the fitting reader.

A manifest of several shards gives a ``RecordSet``; anything else a ``RecordFile``, with the
manifest that names it (given, or ``NAME.stoker.json`` beside the ``.rec``) attached.
"""

from __future__ import annotations

import os

from stoker.formats.opening import open_set
from stoker.formats.recordio.insightface import with_layout
from stoker.formats.recordio.manifest import KIND, MANIFEST_SUFFIX, class_names
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
    idx: str | None = None
    if p.endswith(".idx"):
        rec = p[:-4] + ".rec"
        if not os.path.exists(rec):
            raise FileNotFoundError(f"{p}: no {os.path.basename(rec)} beside it")
        idx, p = p, rec
    src = open_set(p, KIND, sibling=manifest_path_for(p))
    if (m := src.manifest) is not None:
        mpath = str(src.manifest_path)
        precheck_shards(mpath, {"shards": src.entries}, verify_checksums)
        if len(src.entries) != 1:
            return RecordSet(p, verify_checksums=verify_checksums, cache=cache)
        return _with_manifest(open_shard(mpath, src.entries[0], **kw), m)
    crc = default_crc_path(p)
    return _with_layout(
        RecordFile(
            p,
            idx,
            crc_path=crc if os.path.exists(crc) else None,
            **kw,  # type: ignore[arg-type]
        )
    )
