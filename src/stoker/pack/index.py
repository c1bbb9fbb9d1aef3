"""``stoker index``: a stoker manifest for WebDataset tars that stoker did not write (LAION-style
collections named by a brace pattern), without copying them.

Each tar is read once (a URL downloaded to a temporary file in the cache's folder), its size
and sha256 taken, and its members indexed as the reader groups them (:func:`~stoker.formats.
wds.index_file`: WebDataset's rule, the key is the member name up to the first dot of its
basename). The index of each tar is written beside the manifest as a binary side-car
(``NAME.stkwds``, the member index's own layout), and the manifest (kind ``wds``) lists each tar
with its records, bytes, sha256 and side-car, and a schema of the image, ``.cls``, ``.txt`` and
``.json`` (other members are indexed and left unread). A sample without exactly one image, or
anything else the reader refuses, stops the index naming the tar, the sample and its byte
offset: nothing is dropped silently.

The manifest names its tars by their path relative to its folder when OUT is in the tars'
folder (or a folder above them); tar URLs elsewhere (a bucket or CDN the user cannot write) by
their URL, with the side-cars beside OUT, read with ``allow_hosts`` (``docs/remote.md``). Tars are indexed ``workers`` at a time; each finished
tar's entry is kept in a journal in the cache folder, so a killed run resumes with the tars
it had not finished (a tar whose size changed since is indexed again). The side-cars, then the
manifest, are written atomically (a URL: uploaded, the manifest last).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed

from stoker._core.atomic import atomic_write
from stoker._core.checksum import file_sha256
from stoker._core.progress import make_progress
from stoker.formats.manifest import MANIFEST_SUFFIX, write_set
from stoker.formats.registry import BRACE
from stoker.formats.remote import RemoteOptions, redact, remote_url
from stoker.formats.wds import FORMAT, RAW_FIELDS, index_file, raw_schema

__all__ = ["expand", "index_collection"]

_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


def expand(source: str) -> list[str]:
    """The tars ``source`` names: ``@FILE`` (one path or URL a line, ``#`` comments), a brace
    pattern (``{000000..001023}``, zero-padded as written; ``{a,b}``), a local glob, or one
    path or URL."""
    if source.startswith("@"):
        with open(source[1:], encoding="utf-8") as f:
            lines = [ln.strip() for ln in f]
        return [ln for ln in lines if ln and not ln.startswith("#")]
    out: list[str] = []
    for name in _braces(source):
        if remote_url(name) is None and glob.has_magic(name):
            out.extend(sorted(glob.glob(name)))
        else:
            out.append(name)
    return out


def _braces(s: str) -> list[str]:
    m = BRACE.search(s)
    if m is None:
        return [s]
    body, rest = m.group(1), _braces(s[m.end() :])
    r = _RANGE.fullmatch(body)
    if r is not None:
        a, b = int(r.group(1)), int(r.group(2))
        width = len(r.group(1)) if r.group(1).startswith("0") else 0
        step = 1 if b >= a else -1
        items = [str(i).zfill(width) for i in range(a, b + step, step)]
    elif "," in body:
        items = body.split(",")
    else:  # not a pattern: the braces are part of the name
        return [s[: m.end()] + t for t in rest]
    return [s[: m.start()] + i + t for i in items for t in rest]


def _folder(path: str) -> str:
    return path.rsplit("/", 1)[0] if remote_url(path) else os.path.dirname(os.path.abspath(path))


def _names(folder: str, tars: list[str]) -> list[tuple[str, str]]:
    """Each tar's name in the manifest in ``folder`` and its side-car's: both relative to the
    folder for a tar in it (or below); a tar URL elsewhere is named by its URL (read with
    ``allow_hosts``), its side-car written in the folder under its path below the common folder
    of such tars. A local tar elsewhere is a ``ValueError``."""
    top = folder.rstrip("/") + "/"
    full = [t if remote_url(t) else os.path.abspath(t) for t in tars]
    away = [t for t in full if not t.startswith(top)]
    if local := [t for t in away if not remote_url(t)]:
        raise ValueError(
            f"{local[0]} is not in {redact(folder)}: write the index in the tars' folder (or one "
            "above it), since a manifest names local files inside its folder"
        )
    common = len(os.path.commonprefix(away).rsplit("/", 1)[0]) + 1 if away else 0
    return [
        (t[len(top) :], _side_name(t[len(top) :]))
        if t.startswith(top)
        else (t, _side_name(t[common:]))
        for t in full
    ]


def _one(tar: str, options: RemoteOptions) -> tuple[dict, bytes]:
    """The journal entry of one tar (its size, sha256, records, longest fields) and its
    index's side-car bytes."""
    if remote_url(tar) is None:
        return _facts(tar, tar)
    from stoker.storage.remote import Remote

    remote = Remote(tar, options.storage_options)
    folder = options.cache().root
    os.makedirs(folder, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".index-", suffix=".tar") as f:
        remote.download(tar, f, size=remote.size(tar), what=redact(tar))  # type: ignore[arg-type]
        f.flush()
        return _facts(f.name, redact(tar))


def _facts(path: str, where: str) -> tuple[dict, bytes]:
    index = index_file(path, where)
    longest = {n: index.max_size(s) for s, n in RAW_FIELDS.items()}
    entry = {
        "bytes": os.path.getsize(path),
        "sha256": file_sha256(path),
        "records": len(index),
        "longest": {n: v for n, v in longest.items() if v is not None},
    }
    return entry, b"".join(index.chunks())


def index_collection(
    source: str,
    out: str,
    *,
    workers: int = 4,
    engine: str = "local",
    remote: RemoteOptions | None = None,
    progress: bool | None = None,
) -> dict:
    """Index the tars ``source`` names (:func:`expand`) into the manifest ``out`` (a path or
    URL ending in ``.stoker.json``); see the module docstring. ``engine``: ``"local"``
    (``workers`` processes here) or ``"ray"`` (a Ray task per tar, on the cluster
    ``RAY_ADDRESS`` names or one started here). Returns the manifest."""
    if not out.endswith(MANIFEST_SUFFIX):
        raise ValueError(f"{out}: the index is a manifest, NAME{MANIFEST_SUFFIX}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    if engine not in ("local", "ray"):
        raise ValueError(f"engine is 'local' or 'ray', got {engine!r}")
    tars = expand(source)
    if not tars:
        raise ValueError(f"{redact(source)} names no tar")
    options = remote or RemoteOptions()
    folder = _folder(out)
    names = _names(folder, tars)
    name_of = dict(zip(tars, names, strict=True))
    journal = _Journal(out, options)
    todo = [t for t in tars if journal.get(t) is None]
    bar = make_progress(len(tars), "index", unit="tar", enabled=progress)
    bar.update(len(tars) - len(todo))
    with tempfile.TemporaryDirectory(dir=_staging(out, options)) as stage:

        def store(tar: str, got: tuple[dict, bytes]) -> None:
            entry, index = got
            side = os.path.join(stage, hashlib.sha256(tar.encode()).hexdigest()[:16])
            with atomic_write(side) as f:
                f.write(index)
            _put(side, _at(folder, name_of[tar][1]), options)
            journal.add(tar, entry)
            bar.update(1)

        try:
            if todo:  # every tar in the journal: no pool or Ray runtime to start
                (_on_ray if engine == "ray" else _on_processes)(todo, options, workers, store)
        finally:
            bar.close()
        return _commit(out, tars, names, journal, stage, options)


Store = Callable[[str, tuple[dict, bytes]], None]


def _on_processes(todo: list[str], options: RemoteOptions, workers: int, store: Store) -> None:
    """Each tar indexed by one of ``workers`` processes (a tar's header walk holds the
    interpreter lock), stored here as it finishes; the first failure is raised once every
    other tar is stored."""
    from stoker.pack._procs import pool_context
    from stoker.storage.remote import storage_env

    failed: list[BaseException] = []
    with ProcessPoolExecutor(
        min(workers, len(todo)),
        pool_context(),
        initializer=_start,
        initargs=(os.getpid(), storage_env()),
    ) as pool:
        running = {pool.submit(_one, t, options): t for t in todo}
        for got in as_completed(running):
            if got.exception() is not None:
                failed.append(got.exception())  # type: ignore[arg-type]
            else:
                store(running[got], got.result())
    if failed:  # every other tar is stored first: a rerun does only what failed
        raise failed[0]


def _start(main_pid: int, env: dict[str, str]) -> None:
    """A worker reaches storage with the variables of the process that started the index."""
    from stoker.pack._procs import worker_init

    os.environ.update(env)
    worker_init(main_pid)


def _on_ray(todo: list[str], options: RemoteOptions, workers: int, store: Store) -> None:
    """Each tar indexed by a Ray task (run again if its worker dies), stored here."""
    from stoker.pack.engines.ray_engine import MAX_RETRIES, import_ray

    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=MAX_RETRIES)(_one)
        running = {task.remote(t, options): t for t in todo}
        failed: list[BaseException] = []
        while running:
            (done,), _ = ray.wait(list(running), num_returns=1)
            tar = running.pop(done)
            try:
                got = ray.get(done)
            except Exception as e:  # noqa: BLE001 - the task's error, raised once the rest is stored
                failed.append(getattr(e, "cause", None) or e)
                continue
            store(tar, got)
        if failed:
            raise failed[0]
    finally:
        if started:
            ray.shutdown()


def _side_name(name: str) -> str:
    """The side-car of the tar ``name``: ``NAME.stkwds`` beside it."""
    return (name[:-4] if name.endswith(".tar") else name) + ".stkwds"


def _at(folder: str, name: str) -> str:
    return f"{folder}/{name}" if remote_url(folder) else os.path.join(folder, name)


def _staging(out: str, options: RemoteOptions) -> str:
    folder = _folder(out) if remote_url(out) is None else options.cache().root
    os.makedirs(folder, exist_ok=True)
    return folder


def _put(local: str, dest: str, options: RemoteOptions) -> None:
    """``local`` stored at ``dest`` whole (a URL: uploaded; a path: renamed into place)."""
    if remote_url(dest) is None:
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(local, dest)
        return
    from stoker.storage.remote import Remote

    Remote(dest, options.storage_options).upload(local, dest)


def _commit(
    out: str,
    tars: list[str],
    names: list[tuple[str, str]],
    journal: _Journal,
    stage: str,
    options: RemoteOptions,
) -> dict:
    """The manifest of every tar, written last (a URL: staged and uploaded)."""
    entries: list[dict] = []
    longest: dict[str, int] = {}
    for tar, (name, side) in zip(tars, names, strict=True):
        e = journal.get(tar)
        assert e is not None
        for n, v in e["longest"].items():
            longest[n] = max(longest.get(n, 0), v)
        entries.append(
            {
                "files": {"data": name, "index": side},
                "records": e["records"],
                "bytes": e["bytes"],
                "checksums": {"data.sha256": e["sha256"]},
            }
        )
    local = out if remote_url(out) is None else os.path.join(stage, os.path.basename(out))
    write_set(FORMAT.name, local, entries, schema=raw_schema(longest))
    if local != out:
        _put(local, out, options)
    journal.done()
    with open(local, encoding="utf-8") as f:
        return json.load(f)


class _Journal:
    """What is done of one index (``out``): a tar's entry is kept once its side-car is stored,
    one JSON line each, in the cache folder; a tar whose size changed is indexed again."""

    def __init__(self, out: str, options: RemoteOptions) -> None:
        key = hashlib.sha256(redact(out).encode()).hexdigest()[:24]
        folder = os.path.join(options.cache().root, "index-journal")
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, key + ".jsonl")
        self._done: dict[str, dict] = {}
        self._options = options
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        tar, entry = json.loads(line)
                    except ValueError:  # a line cut by a kill
                        continue
                    self._done[tar] = entry

    def get(self, tar: str) -> dict | None:
        entry = self._done.get(tar)
        if entry is not None and "checked" not in entry:
            try:
                same = _size(tar, self._options) == entry["bytes"]
            except OSError:
                same = False
            if not same:
                return None
            entry["checked"] = True
        return entry

    def add(self, tar: str, entry: dict) -> None:
        self._done[tar] = {**entry, "checked": True}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps([tar, entry]) + "\n")

    def done(self) -> None:
        os.unlink(self.path)


def _size(tar: str, options: RemoteOptions) -> int:
    if remote_url(tar) is None:
        return os.path.getsize(tar)
    from stoker.storage.remote import Remote

    return Remote(tar, options.storage_options).size(tar)
