"""What a format folder exports: one :class:`Format`, registered by one line in
:mod:`stoker.formats.registry`.

A :class:`Format` is the format's name and the facts everything above the formats asks about
it, so that no other room spells a format's name or its files:

- ``name``: the registry name (``--format NAME``, ``format=NAME``);
- ``roles``: each file of a shard by role and suffix (``{"data": ".rec", "index": ".idx",
  "crc": ".crc32c"}``); ``data`` is the file that holds the records;
- ``extensions``: the file endings that tell the format of a bare file;
- ``required``: the roles every shard entry of its manifest names (``data`` at least);
  ``checksums``: the checksums every entry records (``"index.sha256"``), see
  :mod:`stoker.formats.manifest`; ``options``: a callable checking the manifest's
  ``options`` object (what only this format reads there, e.g. TFRecord's feature names);
- ``v1``: the :class:`Dialect` of the version-1 manifests it wrote before every format shared
  one schema (``None``: it has none); a version-1 manifest opens through it;
- callables, named ``"module:attribute"`` and imported on first use (:meth:`Format.load`):
  ``reader(path, **options) -> Reader``, ``open_shard`` (the format's
  :class:`~stoker.formats.base.Shard` class, what a :class:`~stoker.formats.sharded.
  ShardedReader` opens each shard with),
  ``shard_path(prefix, shard) -> str`` (the data file of shard ``shard``, ``None``: the one
  unsharded file), ``writer``, ``manifest``, ``verify`` and ``sniff`` (see the registry);
- ``remote``: whether its sets are read in place from object storage and HTTP(S).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FORMATS", "Dialect", "Format"]


@dataclass(frozen=True)
class Dialect:
    """A format's version-1 manifest: its ``format`` field (``"stoker-recordio"``), its shard
    entry's fields as ``{field: (kind, where)}`` and the top-level keys that were the format's
    own (now under ``options``). ``kind`` is ``"file"``, ``"count"``, ``"sha256"`` or
    ``"u32"``, ending in ``?`` when optional; ``where`` is the version-2 place: a role for a
    file, ``"records"`` or ``"bytes"`` for a count, a checksum's name otherwise."""

    format: str
    entry: Mapping[str, tuple[str, str]]
    options: tuple[str, ...] = ()


@dataclass(frozen=True)
class Format:
    """One format; see the module docstring."""

    name: str
    reader: str
    extensions: tuple[str, ...] = ()
    v1: Dialect | None = None
    writer: str | None = None
    manifest: str | None = None
    verify: str | None = None
    sniff: str | None = None
    remote: bool = False
    roles: Mapping[str, str] = field(default_factory=dict)
    shard_path: str | None = None
    open_shard: str | None = None
    required: tuple[str, ...] = ("data",)
    checksums: tuple[str, ...] = ()
    options: str | None = None

    def load(self, what: str) -> Any:
        """The callable named by field ``what`` (``"reader"``, ``"writer"``, ...)."""
        target = getattr(self, what)
        if target is None:
            raise NotImplementedError(f"the {self.name} format has no {what}")
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)

    def writable(self) -> bool:
        """Whether pack and convert can write this format."""
        return self.writer is not None


#: Every registered format by name: filled by :mod:`stoker.formats.registry` (one line per
#: format) when the ``stoker.formats`` package is imported; read where a format is looked up
#: by name below the registry (a manifest's ``kind``).
FORMATS: dict[str, Format] = {}
