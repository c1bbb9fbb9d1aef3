"""``stoker.pack``: the front door of a pack or convert run, from its options to the committed
set.

A run is shard jobs (``jobs.py``): the plan fixes the order, every record's key and shard
before any image is read (``plan.py``); an engine places one job per shard (``LocalEngine``,
this machine's processes, or ``RayEngine``); a destination (``destination.py``, a folder or a
URL) commits each finished shard and, after every count is checked, the manifest last. A rerun
keeps each shard that is done and verifies, and writes every other shard again from scratch
(``docs/pack.md``, "Resume").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from stoker.formats.registry import DEFAULT as DEFAULT_FORMAT
from stoker.pack.images import DEFAULT_MAX_PIXELS
from stoker.pack.plan.options import PackOptions, output_prefix
from stoker.pack.run.report import PackReport

__all__ = ["PackOptions", "PackReport", "convert", "output_prefix", "pack", "run_pack"]


def pack(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    workers: int | None = None,
    resize: int | None = None,
    quality: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    shard_size: int | None = None,
    list_file: bool = False,
    overwrite: bool = False,
    resume: bool = True,
    max_rejects: int | None = None,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    follow_symlinks: bool = False,
    root: str | os.PathLike[str] | None = None,
    allow_outside_root: bool = False,
    progress: bool | None = None,
    schema: Any = None,
    format: str = DEFAULT_FORMAT,
    labels: str = "folders",
    engine: str = "local",
    ray_address: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    layout: str = "plain",
    _check: Callable[..., Any] | None = None,
) -> PackReport:
    """Pack an image folder (one class per top-level subfolder), an im2rec ``.lst``, or a
    ``.jsonl``/``.csv`` listing of images with fields (``docs/pack.md``) into
    ``OUT.rec``/``OUT.idx`` (``OUT-NNNNN.*`` with ``shard_size``), ``OUT.crc32c``,
    ``OUT.stoker.json``, ``OUT.rejects.tsv`` and, with ``list_file``, ``OUT.lst``.

    ``workers``: processes (default: all cores). ``resize``: shorter side in pixels;
    ``quality``: JPEG quality; either re-encodes every image (default: original JPEG bytes are
    kept). ``shuffle``/``seed``: a seeded order. ``max_rejects``: raise
    :class:`TooManyRejectsError` when more files are rejected (after writing the rejects file).
    ``max_pixels``: header pixel limit (decompression bombs). ``root``: folder that ``.lst``
    and listing paths are relative to (default: the list's folder; an absolute path is read as
    is); given, a path that leads outside it is rejected ``outside_root`` unless
    ``allow_outside_root``. A pack that writes nothing raises :class:`TooManyRejectsError`. ``format``: what to write, ``"recordio"`` (the
    default: ``OUT.rec`` …, as above), ``"tfrecord"`` or ``"wds"`` (WebDataset ``.tar``
    shards), each with the same manifest, rejects list and resume. ``schema``: a listing's schema in place of the one its
    rows imply (a ``Schema``, its JSON dict or a JSON file). ``labels``: a folder's labels,
    ``"folders"`` (one class per top-level subfolder; images with no subfolder to class them
    are refused) or ``"none"`` (every record labelled 0, no class names). ``OUT``'s folder is
    created when missing, after the source was found. ``progress``: a bar on stderr
    (default: when stderr is a terminal). ``engine``: ``"local"`` (default: this machine's
    process pool) or ``"ray"`` (one Ray task per shard, on the cluster at ``ray_address`` or
    ``RAY_ADDRESS``, else on a Ray started here; needs ``pip install stoker[ray]``); both
    write the same bytes (``docs/scale.md``). ``out`` may be a URL (``s3://``, ``gs://``, ...):
    the pack is staged locally, then uploaded, manifest last (``storage_options``: how to reach
    it; ``docs/remote.md``). ``layout``: ``"plain"`` (default) or ``"insightface"``: one
    ``.rec`` whose images are keys ``1..N``, one identity per class folder, followed by
    insightface's header record 0 and one record per identity with its range of keys, as
    insightface's training code reads them (any reject stops the run). ``_check``: internal, a module-level stand-in for
    ``check_image`` run in the workers (fault-injection tests). See ``docs/pack.md`` for the
    checks, the normalisation policy and resume.

    The options are checked by :class:`PackOptions` (``TypeError`` for a wrong type,
    ``ValueError`` out of range); :func:`run_pack` takes one made already.
    """
    options = PackOptions(
        src,
        out,
        workers=workers,
        resize=resize,
        quality=quality,
        shuffle=shuffle,
        seed=seed,
        shard_size=shard_size,
        list_file=list_file,
        overwrite=overwrite,
        resume=resume,
        max_rejects=max_rejects,
        max_pixels=max_pixels,
        follow_symlinks=follow_symlinks,
        root=root,
        allow_outside_root=allow_outside_root,
        progress=progress,
        schema=schema,
        check=_check,
        format=format,
        labels=labels,
        engine=engine,
        ray_address=ray_address,
        layout=layout,
    )
    return run_pack(options, storage_options=storage_options)


def run_pack(
    options: PackOptions, *, storage_options: Mapping[str, Any] | None = None
) -> PackReport:
    """Pack as ``options`` say (see :func:`pack`)."""
    from stoker.pack.engines.jobs import LocalEngine, run_jobs

    if options.engine == "ray":  # a URL OUT too: each task uploads its own shard
        from stoker.pack.engines.ray_engine import run_ray

        return run_ray(options, storage_options=storage_options)
    engine = LocalEngine(options.worker_count())
    return run_jobs(options, engine, storage_options=storage_options)


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    format: str = DEFAULT_FORMAT,
    source_format: str | None = None,
    source_options: dict[str, Any] | None = None,
    workers: int | None = None,
    shard_size: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    overwrite: bool = False,
    resume: bool = True,
    max_rejects: int | None = None,
    progress: bool | None = None,
    engine: str = "local",
    ray_address: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> PackReport:
    """Copy every sample of the data set ``src`` (anything ``stoker.formats.open`` reads: a
    ``.rec`` with or without a manifest, MXNet's and insightface's included, TFRecord files,
    WebDataset ``.tar`` shards, an LMDB folder, a ``*.stoker.json`` manifest;
    ``source_format`` names the format when the path cannot, ``source_options`` go to its
    reader: an LSUN-style LMDB's ``label=`` or ``labels=``, say) into a set of ``format`` under
    the prefix ``out``: the image bytes, labels, keys and stored fields exactly as the source
    holds them, in its order (``shuffle``/``seed``: a seeded order).

    It is a pack whose items are the source's positions: the same workers, shards
    (``shard_size``), resume of an interrupted run, ``*.partial`` outputs renamed at the end,
    manifest written last, and rejects: a record that fails to read is listed in
    ``OUT.rejects.tsv`` with its key, file and byte offset, and counts against
    ``max_rejects``; ``engine="ray"`` (``ray_address``) and an ``out`` URL
    (``storage_options``: how it is reached) as for :func:`pack`; the plan, shard-job and
    finalize steps take ``convert=True`` (``docs/scale.md``). Returns the run's
    :class:`PackReport`.
    """
    options = PackOptions(
        src,
        out,
        workers=workers,
        shuffle=shuffle,
        seed=seed,
        shard_size=shard_size,
        overwrite=overwrite,
        resume=resume,
        max_rejects=max_rejects,
        progress=progress,
        format=format,
        convert=True,
        source_format=source_format,
        source_options=source_options,
        engine=engine,
        ray_address=ray_address,
    )
    return run_pack(options, storage_options=storage_options)
