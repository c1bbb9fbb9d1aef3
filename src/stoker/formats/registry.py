"""The format registry: ``stoker.formats.open(path)`` returns the :class:`~stoker.formats.Reader`
of whatever format ``path`` is, and pack and convert find a format's writer here.

A format is one folder under ``stoker/formats`` plus one :class:`Format` line below. Every
callable is named as ``"module:attribute"`` and imported on first use, so ``import
stoker.formats`` stays cheap and a format's own dependencies (``lmdb``) load only when used.

How ``open`` decides: ``format=`` when given; a ``*.stoker.json`` manifest by its ``format``
field; a file by its extension; a folder by asking each format's ``sniff``.

A format's callables:

- ``reader(path, **options) -> Reader``: open a file, folder or manifest of this format;
- ``writer(prefix, shard, *, schema, resume, checksums) -> ShardWriter``: shard ``shard``
  (``None``: a single unsharded file) of a set written under output prefix ``prefix``;
- ``manifest(manifest_path, shards, *, classes, schema, pack, rejects) -> None``: write the
  set's ``NAME.stoker.json`` from its shards' ``commit()`` entries (atomically, last);
- ``verify(path, **options) -> report``: the whole-file check ``stoker verify`` runs (the
  report has ``.ok`` and ``.problems``);
- ``sniff(path) -> bool``: for folders (and files without a known extension).

``remote=True``: the reader reads the format's sets in object storage and on HTTP(S) servers
in place, opened by their manifest's URL (its ``reader`` takes ``remote=``, a
:class:`~stoker.formats.remote.RemoteOptions`); other formats are refused there with advice.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

from stoker.formats.base import Reader
from stoker.formats.manifest import MANIFEST_SUFFIX, fail, manifest_format
from stoker.formats.remote import (
    REMOTE_KEYWORDS,
    RemoteFiles,
    RemoteOptions,
    local_path,
    remote_url,
)

__all__ = ["DEFAULT_FORMAT", "FORMATS", "Format", "format_of", "get", "open_reader", "register"]

#: the format pack and convert write when none is named
DEFAULT_FORMAT = "recordio"


@dataclass(frozen=True)
class Format:
    name: str
    reader: str
    extensions: tuple[str, ...] = ()
    manifest_format: str | None = None
    writer: str | None = None
    manifest: str | None = None
    verify: str | None = None
    sniff: str | None = None
    remote: bool = False

    def load(self, what: str) -> Any:
        """The callable named by field ``what`` (``"reader"``, ``"writer"``, ...)."""
        target = getattr(self, what)
        if target is None:
            raise NotImplementedError(f"the {self.name} format has no {what}")
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


FORMATS: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    FORMATS[fmt.name] = fmt
    return fmt


_R = "stoker.formats.recordio"
_T = "stoker.formats.tfrecord"
_W = "stoker.formats.wds"
_L = "stoker.formats.lmdb"
# One line per format.
register(Format("recordio", f"{_R}.seam:open_reader", (".rec", ".idx"), "stoker-recordio", f"{_R}.shardwriter:open_writer", f"{_R}.shardwriter:write_set_manifest", f"{_R}.seam:verify", remote=True))  # fmt: skip
register(Format("tfrecord", f"{_T}:open_reader", (".tfrecord", ".tfrecords", ".tfrec", ".tfrecord.gz", ".tfrecords.gz"), "stoker-tfrecord", f"{_T}:open_writer", f"{_T}:write_set_manifest", f"{_T}:verify", remote=True))  # fmt: skip
register(Format("wds", f"{_W}:open_reader", (".tar",), "stoker-wds", f"{_W}:open_writer", f"{_W}:write_set_manifest", f"{_W}:verify", remote=True))  # fmt: skip
register(Format("lmdb", f"{_L}:open_reader", (".mdb", ".lmdb"), None, None, None, f"{_L}:verify", f"{_L}:sniff"))  # fmt: skip


def get(name: str) -> Format:
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"unknown format {name!r}; stoker knows {sorted(FORMATS)}")
    return fmt


def format_of(path: str | os.PathLike[str], *, remote: RemoteOptions | None = None) -> Format:
    """The format of ``path`` (see the module docstring); ``ValueError`` when none fits. A URL's
    manifest is read through the shard cache (``remote``: how)."""
    p = os.fspath(path)
    url = remote_url(p)
    if url is not None:
        return _remote_format(url, remote)
    if p.endswith(MANIFEST_SUFFIX):
        name = manifest_format(p)
        for fmt in FORMATS.values():
            if fmt.manifest_format == name:
                return fmt
        raise _unknown_format(p, name)
    low = p.lower()
    for fmt in FORMATS.values():
        if fmt.extensions and low.endswith(fmt.extensions):
            return fmt
    if os.path.isdir(p):
        for fmt in FORMATS.values():
            if fmt.sniff is not None and fmt.load("sniff")(p):
                return fmt
    known = ", ".join(e for f in FORMATS.values() for e in f.extensions)
    raise ValueError(
        f"{p}: cannot tell its format (a *{MANIFEST_SUFFIX} manifest, a file ending in {known}, "
        "or an LMDB folder); pass format= to name it"
    )


def _unknown_format(where: str, name: str) -> Exception:
    """The ``ManifestError`` of a manifest whose ``format`` field no format claims."""
    known = sorted(f.manifest_format for f in FORMATS.values() if f.manifest_format)
    return fail(where, f"format {name!r} is not one stoker reads (it reads {known})")


def _remote_format(url: str, remote: RemoteOptions | None) -> Format:
    """The format of a set in object storage: read from its manifest. A format without
    ``remote`` (LMDB) is refused with the way out."""
    from stoker.storage.urls import redact

    if not url.endswith(MANIFEST_SUFFIX):
        low = url.split("?", 1)[0].rstrip("/").lower()
        local_only = [f for f in FORMATS.values() if not f.remote and low.endswith(f.extensions)]
        if local_only or low.endswith(("_lmdb", "-lmdb")):
            raise _local_only(redact(url), local_only[0].name if local_only else "lmdb")
        raise ValueError(
            f"{redact(url)}: a set in object storage is opened by its manifest "
            f"(NAME{MANIFEST_SUFFIX}, which `stoker pack` and `stoker convert` write)"
        )
    name = manifest_format(RemoteFiles(url, remote).manifest_copy())
    for fmt in FORMATS.values():
        if fmt.manifest_format == name:
            if not fmt.remote:
                raise _local_only(redact(url), fmt.name)
            return fmt
    raise _unknown_format(redact(url), name)


def _local_only(url: str, name: str) -> ValueError:
    """The refusal of a set of format ``name`` at ``url``, which stoker reads locally only."""
    why = (
        "an LMDB database is one file read by random page access, often tens of GB: it is "
        "not fetched whole"
        if name == "lmdb"
        else f"the {name} format is read from local files only"
    )
    return ValueError(
        f"{url}: {why}. `stoker convert` it to RecordIO, TFRecord or WebDataset (the output "
        "may be a URL, read in place from there), or copy it to local disk"
    )


def open_reader(
    path: str | os.PathLike[str], *, format: str | None = None, **options: Any
) -> Reader:
    """The :class:`Reader` of ``path`` in its format (``format=`` to name it). ``path`` may be
    a URL: ``storage_options=``, ``cache_dir=``, ``cache_limit=`` and ``prefetch_shards=`` (or
    one ``remote=`` :class:`~stoker.formats.remote.RemoteOptions`) say how to reach and cache
    it; they are ignored for a local path."""
    p = local_path(os.fspath(path))
    given = {k: options.pop(k) for k in REMOTE_KEYWORDS if k in options}
    if given:
        if options.get("remote") is not None:
            raise TypeError(f"pass remote= or {sorted(given)}, not both")
        options["remote"] = RemoteOptions(**given)
    if remote_url(p) is None:
        options.pop("remote", None)
    elif format is not None and not get(format).remote:
        from stoker.storage.urls import redact

        raise _local_only(redact(p), format)
    fmt = get(format) if format is not None else format_of(p, remote=options.get("remote"))
    return fmt.load("reader")(p, **options)
