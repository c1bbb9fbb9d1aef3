"""The format registry: ``stoker.formats.open(path)`` returns the :class:`~stoker.formats.Reader`
of whatever format ``path`` is, and pack and convert find a format's writer here.

A format is one folder under ``stoker/formats`` that exports one :class:`~stoker.formats.spec.
Format` (``FORMAT``), plus one line below that registers it; a format of another package
registers itself when its module is imported, which a ``stoker.formats`` entry point names
(imported when a name is not known: ``docs/contracts.md``). Every callable of a format is named
as ``"module:attribute"`` and imported on first use, so a format's own dependencies (``lmdb``)
load only when used. Nothing outside a format's folder and this module names a format: it asks
for ``names()``, ``writable()``, ``DEFAULT`` or ``get(name)``.

How ``open`` decides: ``format=`` when given; a ``*.stoker.json`` manifest by its ``kind``
(a version-1 manifest by its ``format`` field, each format's ``v1`` dialect); a file by its extension; a folder by asking each format's ``sniff``.

A format's callables:

- ``reader(path, **options) -> Reader``: open a file, folder or manifest of this format;
- ``writer(prefix, shard, *, schema, checksums) -> ShardWriter``: shard ``shard``
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

import glob
import importlib
import os
import re
from typing import Any

from stoker.formats.base import Reader
from stoker.formats.manifest import MANIFEST_SUFFIX, kind_of, manifest_kind, read_json
from stoker.formats.remote import (
    REMOTE_KEYWORDS,
    RemoteFiles,
    RemoteOptions,
    local_path,
    remote_url,
)
from stoker.formats.spec import FORMATS, Format, lookup

__all__ = [
    "BRACE",
    "DEFAULT",
    "FORMATS",
    "Format",
    "format_of",
    "get",
    "names",
    "open_reader",
    "pattern_refusal",
    "register",
    "writable",
]


#: One ``{...}`` of a brace pattern (``shards-{000000..000099}.tar``, ``{a,b}``).
BRACE = re.compile(r"\{([^{}]*)\}")


def pattern_refusal(source: str) -> str | None:
    """What to say of a source that is a pattern of tar shards (it needs ``stoker index``
    first), else ``None``."""
    from stoker.storage.urls import redact

    if not (BRACE.search(source) or (remote_url(source) is None and glob.has_magic(source))):
        return None
    shown = redact(source)
    return (
        f"{shown} is a pattern of tar shards, not a set: index it once with `stoker index "
        f"'{shown}' OUT{MANIFEST_SUFFIX}` (OUT in the tars' folder), then open OUT{MANIFEST_SUFFIX}"
    )


def register(fmt: Format) -> Format:
    FORMATS[fmt.name] = fmt
    return fmt


# One line per format: the folder's FORMAT (stoker.formats.spec).
register(importlib.import_module("stoker.formats.recordio").FORMAT)
register(importlib.import_module("stoker.formats.tfrecord").FORMAT)
register(importlib.import_module("stoker.formats.wds").FORMAT)
register(importlib.import_module("stoker.formats.lmdb").FORMAT)
#: What pack and convert write when no format is named.
DEFAULT = "recordio"


def names() -> list[str]:
    """Every format's registry name, in registration order."""
    return list(FORMATS)


def writable() -> list[str]:
    """The names of the formats pack and convert can write, in registration order."""
    return [name for name, fmt in FORMATS.items() if fmt.writable()]


def get(name: str) -> Format:
    fmt = lookup(name)
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
        return FORMATS[manifest_kind(p)]
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
    fmt = FORMATS[kind_of(read_json(RemoteFiles(url, remote).manifest_copy()), redact(url))]
    if not fmt.remote:
        raise _local_only(redact(url), fmt.name)
    return fmt


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
    a URL: ``storage_options=``, ``cache_dir=``, ``cache_limit=``, ``prefetch_shards=`` and
    ``allow_hosts=`` (or one ``remote=`` :class:`~stoker.formats.remote.RemoteOptions`) say how
    to reach and cache it; they are ignored for a local path other than a manifest."""
    p = local_path(os.fspath(path))
    given = {k: options.pop(k) for k in REMOTE_KEYWORDS if k in options}
    if given:
        if options.get("remote") is not None:
            raise TypeError(f"pass remote= or {sorted(given)}, not both")
        options["remote"] = RemoteOptions(**given)
    if remote_url(p) is not None and format is not None and not get(format).remote:
        from stoker.storage.urls import redact

        raise _local_only(redact(p), format)
    fmt = get(format) if format is not None else format_of(p, remote=options.get("remote"))
    if remote_url(p) is None and not (fmt.remote and p.endswith(MANIFEST_SUFFIX)):
        options.pop("remote", None)  # a local manifest may name files elsewhere (allow_hosts)
    return fmt.load("reader")(p, **options)
