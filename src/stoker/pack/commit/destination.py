"""Where a set is committed: a folder or a URL. A destination decides how a finished shard
and then the set's own files are committed; the engines and the step commands ask
:func:`destination` for one and never look at OUT themselves.

``Folder``
    A shard job writes its files in place (``*.partial``, renamed) and commits with its
    side-car beside them (``shardjob.run_shard``); finalize checks every side-car and file and
    writes the rejects list, the ``.lst`` and the manifest last (``setfiles.finalize``).
    Overwriting a committed set (its manifest is there and ``overwrite``): the shards are
    written in the hidden folder ``.NAME.stoker-staging/`` beside OUT instead, and finalize
    moves them in (a rename on the same file system), then the set's files, the manifest last:
    the old set stays whole until the new one is, and a rerun resumes in that folder.
``Url``
    A shard job stages its shard in this machine's staging folder, uploads the files, then
    its side-car (the commit point at the URL); finalize checks the objects, writes the set's
    files in the staging folder and uploads them, the manifest last (``remote.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stoker.formats.manifest import MANIFEST_SUFFIX
from stoker.formats.remote import is_url
from stoker.pack.commit.setfiles import finalize
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.plan import Plan
from stoker.pack.run.outputs import OutputPaths
from stoker.pack.run.report import PackReport
from stoker.pack.run.shardjob import ShardOutcome, forget_shards, run_shard

__all__ = ["Destination", "Folder", "Url", "destination"]


@dataclass(frozen=True)
class Folder:
    """A local (or mounted) folder; the base of every destination (see the module
    docstring). ``shard`` takes ``pool`` and ``bar``, ``finalize`` takes ``resumed`` and
    ``check``, as ``shardjob.run_shard`` and ``setfiles.finalize`` do. ``staging``: an
    overwrite of a committed set, staged beside it."""

    staging: bool = False

    def here(self, options: PackOptions, plan: Plan) -> tuple[PackOptions, Plan]:
        """``options`` and ``plan`` pointed at the folder this machine writes in."""
        if not self.staging:
            return options, plan
        prefix = _staging_prefix(options.prefix)
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
        return dataclasses.replace(options, out=prefix), dataclasses.replace(plan, prefix=prefix)

    def refuse_existing(self, options: PackOptions, paths: OutputPaths) -> None:
        """An :class:`OutputExistsError` when a set is there already."""
        paths.refuse_existing()

    def local_prefix(self, options: PackOptions) -> str:
        """OUT as a local path prefix, for the files that stay on this machine (a plan)."""
        return options.prefix

    def forget(self, options: PackOptions, plan: Plan) -> None:
        """Every shard's commit point removed: each shard is written again."""
        forget_shards(*self.here(options, plan))

    def shard(self, options: PackOptions, plan: Plan, fp: str, s: int, **kw: Any) -> ShardOutcome:
        """Shard ``s`` written and committed (or found done)."""
        return run_shard(*self.here(options, plan), fp, s, **kw)

    def abandon(self, options: PackOptions, plan: Plan, journal: str) -> None:
        """A run stopped before it committed any shard: nothing to resume, so its
        ``journal`` and lock files go too (a staging folder with them)."""
        here_options, here_plan = self.here(options, plan)
        if not forget_shards(here_options, here_plan, journal=journal):
            return
        if self.staging:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(here_options.prefix))

    def finalize(
        self, options: PackOptions, plan: Plan, fp: str, t0: float, **kw: Any
    ) -> PackReport:
        """Every shard checked, the set's files committed, the manifest last."""
        here_options, here_plan = self.here(options, plan)
        report = finalize(here_options, here_plan, fp, t0, **kw)
        return _move_in(report, here_options.prefix, options.prefix) if self.staging else report


def _staging_prefix(prefix: str) -> str:
    """Where an overwrite of the set at ``prefix`` is staged: a hidden folder beside it."""
    folder, name = os.path.split(os.path.abspath(prefix))
    return os.path.join(folder, f".{name}.stoker-staging", name)


def _move_in(report: PackReport, staged: str, prefix: str) -> PackReport:
    """Rename the finished set's files from the staging folder to ``prefix``'s, the manifest
    last; the report with the final paths."""
    folder = os.path.dirname(staged)
    final = os.path.dirname(os.path.abspath(prefix))
    manifest = os.path.basename(report.manifest)
    for name in sorted(os.listdir(folder)):
        if name != manifest and not name.endswith(".partial"):
            os.replace(os.path.join(folder, name), os.path.join(final, name))
    os.replace(os.path.join(folder, manifest), os.path.join(final, manifest))
    shutil.rmtree(folder, ignore_errors=True)
    return report.moved(lambda p: os.path.join(final, os.path.basename(p)))


@dataclass(frozen=True)
class Url(Folder):
    """Object storage (``s3://``, ``gs://``, ...), reached with ``storage_options``."""

    storage_options: Mapping[str, Any] | None = None

    def here(self, options: PackOptions, plan: Plan) -> tuple[PackOptions, Plan]:
        from stoker.pack.commit.remote import staged

        return staged(options, plan)

    def local_prefix(self, options: PackOptions) -> str:
        """OUT's last name, in the current folder."""
        return options.prefix.rstrip("/").rsplit("/", 1)[-1]

    def refuse_existing(self, options: PackOptions, paths: OutputPaths) -> None:
        from stoker.pack.commit.remote import refuse_existing_url

        refuse_existing_url(options.prefix, self.storage_options)

    def forget(self, options: PackOptions, plan: Plan) -> None:
        from stoker.pack.commit.remote import forget_url

        forget_url(options, plan, self.storage_options)

    def abandon(self, options: PackOptions, plan: Plan, journal: str) -> None:
        """Nothing: shards committed at the URL are known by the staging folder's journal."""

    def shard(self, options: PackOptions, plan: Plan, fp: str, s: int, **kw: Any) -> ShardOutcome:
        from stoker.pack.commit.remote import shard_to_url

        return shard_to_url(options, plan, fp, s, storage_options=self.storage_options, **kw)

    def finalize(
        self, options: PackOptions, plan: Plan, fp: str, t0: float, **kw: Any
    ) -> PackReport:
        from stoker.pack.commit.remote import finalize_url

        kw.pop("check", None)  # the objects are always checked: another machine wrote them
        return finalize_url(options, plan, fp, t0, storage_options=self.storage_options, **kw)


#: what :func:`destination` gives: a :class:`Folder` or one of its kind
Destination = Folder


def destination(
    options: PackOptions, storage_options: Mapping[str, Any] | None = None
) -> Destination:
    """The destination of ``options``' output prefix: a :class:`Url` for a URL (reached with
    ``storage_options``), else a :class:`Folder` (staged when it overwrites a committed set)."""
    if is_url(options.prefix):
        return Url(storage_options=dict(storage_options) if storage_options is not None else None)
    committed = os.path.exists(options.prefix + MANIFEST_SUFFIX)
    return Folder(staging=options.overwrite and committed)
