"""The plan file of packing as shard jobs (``stoker pack|convert SRC OUT --plan-only``).

:func:`write_plan` lists SRC (``plan.make_plan``, as a one-machine pack does) and writes the
plan atomically: the options that decide the output (SRC, OUT and ``root`` made absolute
when local; a URL as given), a convert's source format and reader options, the plan's
fingerprint (``plan.fingerprint``), the counts and each shard's position range. Nothing in it
depends on the time, the host or the worker count: the same SRC and options give the same
file. :func:`load_plan` reads it back and lists SRC again, refusing a SRC that no longer
gives the same fingerprint. The steps themselves are in ``steps.py``.

The plan file is a local path, also for a URL OUT (``NAME.plan.json`` in the current folder
by default): it is small, each shard job needs it before it touches any storage, and a
scheduler ships such a file with its jobs (a shared home folder, a job's attached files, a
Kubernetes ConfigMap).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from stoker._core.atomic import atomic_write
from stoker._core.errors import PackError
from stoker.formats.remote import is_url
from stoker.pack.commit.destination import destination
from stoker.pack.commit.setfiles import check_listing_rejects, make_out_dir
from stoker.pack.plan.options import PackOptions
from stoker.pack.plan.plan import Plan, fingerprint, make_plan
from stoker.pack.run.shardjob import output_paths, shard_bounds

__all__ = ["PLAN_SUFFIX", "load_plan", "parse_shards", "plan_pack", "write_plan"]

PLAN_VERSION = 1
PLAN_SUFFIX = ".plan.json"

#: The options a plan file keeps besides SRC, OUT, root and schema: those of the output.
_PLAN_OPTIONS = (
    "resize",
    "quality",
    "shuffle",
    "seed",
    "shard_size",
    "list_file",
    "max_rejects",
    "max_pixels",
    "follow_symlinks",
    "allow_outside_root",
    "format",
    "labels",
    "convert",
    "source_format",
)


def plan_pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    plan: str | os.PathLike[str] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> str:
    """List ``src`` and write the plan of packing it into ``out`` (``OUT.plan.json``; for a
    URL ``out``, ``NAME.plan.json`` in the current folder; or ``plan``) with the options
    :func:`stoker.pack` takes (``convert=True`` and ``source_format``/``source_options``:
    :func:`stoker.convert`'s); the plan file's path. Then :func:`pack_shards` packs its
    shards anywhere that sees SRC and OUT, and :func:`finalize_pack` writes the manifest
    (``docs/scale.md``). ``storage_options``: how a URL ``out`` is reached."""
    return write_plan(PackOptions(src, out, **options), plan, storage_options=storage_options)


def _absolute(path: Any) -> Any:
    """A local path made absolute (a shard job may run in another folder); a URL as it is."""
    return path if path is None or is_url(path) else os.path.abspath(path)


def _source_options_json(options: PackOptions) -> dict[str, Any] | None:
    """A convert's reader options as the plan keeps them: JSON, a URL source's
    ``RemoteOptions`` as its fields without ``storage_options`` (credentials stay out)."""
    if not options.source_options:
        return None
    out: dict[str, Any] = {}
    for name, value in options.source_options.items():
        if name == "remote" and dataclasses.is_dataclass(value):
            kept = [f.name for f in dataclasses.fields(value) if f.name != "storage_options"]
            out[name] = {"remote_options": {k: getattr(value, k) for k in kept}}
            continue
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise PackError(
                f"source_options[{name!r}] ({type(value).__name__}) cannot go into a plan file "
                "(JSON); give it as a string, number, list or dict"
            ) from None
        out[name] = value
    return out


def _source_options(doc: Any, storage_options: Mapping[str, Any] | None) -> Any:
    """The reader options a plan keeps, with a URL source's ``RemoteOptions`` made again."""
    if not doc:
        return None
    out = dict(doc)
    remote = out.get("remote")
    if isinstance(remote, dict) and "remote_options" in remote:
        from stoker.formats.remote import RemoteOptions

        out["remote"] = RemoteOptions(storage_options=storage_options, **remote["remote_options"])
    return out


def write_plan(
    options: PackOptions,
    path: str | os.PathLike[str] | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> str:
    """Write the plan of ``options`` atomically (see the module NOTE); its path."""
    if options.layout != "plain":
        raise PackError(
            f"layout={options.layout!r} (--layout) writes one file in one run; shard jobs "
            "from a plan write plain sets"
        )
    options = dataclasses.replace(
        options,
        src=_absolute(options.src),
        out=_absolute(options.prefix),
        root=_absolute(options.root),
    )
    plan = make_plan(options)
    dest = destination(options, storage_options)
    local_options, local_plan = dest.here(options, plan)
    make_out_dir(local_options.prefix)
    paths = output_paths(local_options, local_plan)
    if not options.overwrite:
        dest.refuse_existing(options, paths)
    check_listing_rejects(local_options, local_plan, paths)
    doc = {
        "stoker_plan": PLAN_VERSION,
        "src": options.src,
        "out": options.out,
        "root": options.root,
        "schema": options.schema.to_json() if options.schema is not None else None,
        "options": {name: getattr(options, name) for name in _PLAN_OPTIONS},
        "source_options": _source_options_json(options),
        "settings": options.journal_json(),
        "fingerprint": fingerprint(plan, options.journal_json()),
        "records": len(plan.items),
        "found": plan.scan.found,
        "listing_rejects": len(plan.scan.rejects),
        "shards": [list(shard_bounds(plan, s)) for s in range(plan.n_shards)],
    }
    if path is not None:
        target = os.fspath(path)
    else:  # beside OUT; a URL OUT's in this folder
        target = dest.local_prefix(options) + PLAN_SUFFIX
    if is_url(target):
        raise PackError(f"{target}: the plan file is a local path (copy it to each shard job)")
    with atomic_write(target, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    return target


def load_plan(
    path: str | os.PathLike[str],
    *,
    workers: int | None = None,
    progress: bool | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[PackOptions, Plan, str]:
    """The options, the plan (SRC listed again) and the fingerprint of a plan file; a
    :class:`PackError` when it is not one, or when SRC no longer gives the same plan.
    ``storage_options``: how a URL SRC or OUT is reached."""
    where = os.fspath(path)
    try:
        with open(where, "rb") as f:
            doc = json.loads(f.read())
    except OSError as e:
        raise PackError(f"{where}: cannot read the plan: {e.strerror or e}") from None
    except ValueError as e:
        raise PackError(f"{where}: not a stoker plan file (not JSON: {e})") from None
    if not isinstance(doc, dict) or doc.get("stoker_plan") != PLAN_VERSION:
        raise PackError(
            f"{where}: not a stoker plan file of version {PLAN_VERSION}; "
            "make one with stoker pack (or convert) SRC OUT --plan-only"
        )
    try:
        options = PackOptions(
            doc["src"],
            doc["out"],
            root=doc["root"],
            schema=doc["schema"],
            workers=workers,
            progress=progress,
            overwrite=True,
            source_options=_source_options(doc.get("source_options"), storage_options),
            **doc["options"],
        )
        want, n_want = str(doc["fingerprint"]), int(doc["records"])
    except (KeyError, TypeError, ValueError) as e:
        raise PackError(f"{where}: a damaged plan file ({type(e).__name__}: {e})") from None
    plan = make_plan(options)
    fp = fingerprint(plan, options.journal_json())
    if fp != want:
        what = "convert" if options.convert else "pack"
        raise PackError(
            f"{where}: {options.src} no longer gives this plan ({len(plan.items)} records now, "
            f"{n_want} in the plan; or their names, labels, fields or the settings differ); "
            f"make a new plan with stoker {what} SRC OUT --plan-only"
        )
    return options, plan, fp


def parse_shards(spec: Any, n: int) -> range:
    """Shard numbers from ``"a:b"`` (Python slice rules, ``"a:"``, ``":b"``, negatives), ``"3"``,
    an int, a ``slice`` or a ``range``; ``ValueError`` naming the plan's shard count."""
    if isinstance(spec, range):
        spec = slice(spec.start, spec.stop, spec.step)
    if isinstance(spec, str):
        text = spec.strip()
        try:
            if ":" in text:
                a, _, b = text.partition(":")
                spec = slice(int(a) if a.strip() else None, int(b) if b.strip() else None)
            else:
                spec = int(text)
        except ValueError:
            raise ValueError(f"shards must be N or A:B (shard numbers), got {text!r}") from None
    if isinstance(spec, int) and not isinstance(spec, bool):
        if not -n <= spec < n:
            raise ValueError(f"shard {spec} out of range: the plan has {n} shard(s), 0..{n - 1}")
        spec = slice(spec % n, spec % n + 1)
    if not isinstance(spec, slice):
        raise TypeError(f"shards must be a str, int, slice or range, got {type(spec).__name__}")
    return range(*spec.indices(n))
