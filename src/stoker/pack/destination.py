"""Where a set is committed: a folder or a URL. A destination decides how a finished shard
and then the set's own files are committed; the engines and the step commands ask
:func:`destination` for one and never look at OUT themselves.

``Folder``
    A shard job writes its files in place (``*.partial``, renamed) and commits with its
    side-car beside them (``shardjob.run_shard``); finalize checks every side-car and file and
    writes the rejects list, the ``.lst`` and the manifest last (``shardjob.finalize``).
``Url``
    A shard job stages its shard in this machine's staging folder, uploads the files, then
    its side-car (the commit point at the URL); finalize checks the objects, writes the set's
    files in the staging folder and uploads them, the manifest last (``remote.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker.formats.remote import is_url
from stoker.pack.options import PackOptions
from stoker.pack.outputs import OutputPaths
from stoker.pack.plan import Plan
from stoker.pack.report import PackReport
from stoker.pack.shardjob import ShardOutcome, finalize, forget_shards, run_shard

__all__ = ["Destination", "Folder", "Url", "destination"]


@dataclass(frozen=True)
class Folder:
    """A local (or mounted) folder; the base of every destination (see the module
    docstring). ``shard`` takes ``workers`` and ``bar``, ``finalize`` takes ``resumed`` and
    ``check``, as ``shardjob.run_shard`` and ``shardjob.finalize`` do."""

    def here(self, options: PackOptions, plan: Plan) -> tuple[PackOptions, Plan]:
        """``options`` and ``plan`` pointed at the folder this machine writes in."""
        return options, plan

    def refuse_existing(self, options: PackOptions, paths: OutputPaths) -> None:
        """An :class:`OutputExistsError` when a set is there already."""
        paths.refuse_existing()

    def forget(self, options: PackOptions, plan: Plan) -> None:
        """Every shard's commit point removed: each shard is written again."""
        forget_shards(options, plan)

    def shard(self, options: PackOptions, plan: Plan, fp: str, s: int, **kw: Any) -> ShardOutcome:
        """Shard ``s`` written and committed (or found done)."""
        return run_shard(options, plan, fp, s, **kw)

    def finalize(
        self, options: PackOptions, plan: Plan, fp: str, t0: float, **kw: Any
    ) -> PackReport:
        """Every shard checked, the set's files committed, the manifest last."""
        return finalize(options, plan, fp, t0, **kw)


@dataclass(frozen=True)
class Url(Folder):
    """Object storage (``s3://``, ``gs://``, ...), reached with ``storage_options``."""

    storage_options: Mapping[str, Any] | None = None

    def here(self, options: PackOptions, plan: Plan) -> tuple[PackOptions, Plan]:
        from stoker.pack.remote import staged

        return staged(options, plan)

    def refuse_existing(self, options: PackOptions, paths: OutputPaths) -> None:
        from stoker.pack.remote import refuse_existing_url

        refuse_existing_url(options.prefix, self.storage_options)

    def forget(self, options: PackOptions, plan: Plan) -> None:
        from stoker.pack.remote import forget_url

        forget_url(options, plan, self.storage_options)

    def shard(self, options: PackOptions, plan: Plan, fp: str, s: int, **kw: Any) -> ShardOutcome:
        from stoker.pack.remote import shard_to_url

        return shard_to_url(options, plan, fp, s, storage_options=self.storage_options, **kw)

    def finalize(
        self, options: PackOptions, plan: Plan, fp: str, t0: float, **kw: Any
    ) -> PackReport:
        from stoker.pack.remote import finalize_url

        kw.pop("check", None)  # the objects are always checked: another machine wrote them
        return finalize_url(options, plan, fp, t0, storage_options=self.storage_options, **kw)


#: what :func:`destination` gives: a :class:`Folder` or one of its kind
Destination = Folder


def destination(prefix: str, storage_options: Mapping[str, Any] | None = None) -> Destination:
    """The destination of the output prefix ``prefix``: a :class:`Url` for a URL (reached with
    ``storage_options``), else a :class:`Folder`."""
    if is_url(prefix):
        return Url(dict(storage_options) if storage_options is not None else None)
    return Folder()
