"""A set in object storage, read through the node's shard cache (``docs/remote.md``).

:class:`RemoteFiles` is one remote set seen from the readers: its manifest, read once and kept
in the cache by content (so every worker of a run reads the same manifest even when the object
is rewritten meanwhile), and the files the manifest names, each fetched whole into the
:class:`~stoker.storage.ShardCache` when first needed and pinned while a reader holds it.

Every name a manifest gives goes through :func:`stoker.storage.urls.join_under`: it must stay
under the manifest's folder, on the same scheme and bucket. Sizes come from one listing per
folder at open (:meth:`RemoteFiles.list_sizes`), so a missing shard is a ``FileNotFoundError``
naming its URL before any batch; the set's opener (``shardfiles.RemoteShards.check``) refuses a
size other than the manifest's. A cached copy is checked against the size and, where the
manifest records one, the file's CRC32C before it is first read.

:class:`RemoteOptions` holds what a user says about remote data (``storage_options``,
``cache_dir``, ``cache_limit``, ``prefetch_shards``), checked once; the loader, the datasets and
the CLI hand it down unchanged. ``storage_options`` never appears in a repr, an error, a
progress line or a loader's ``state_dict``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from stoker._core.atomic import atomic_write
from stoker._core.errors import CacheFullError, ManifestError, size_text
from stoker.formats.manifest import MAX_MANIFEST_BYTES

if TYPE_CHECKING:
    from stoker.storage.cache import Pin, ShardCache

# The storage clients are imported when a URL is met, never for a local path.


def is_url(path: Any) -> bool:
    """``<scheme>://...`` (see :func:`stoker.storage.urls.is_url`), without importing it for
    the common case of a local path."""
    if not isinstance(path, str) or "://" not in path:
        return False
    from stoker.storage.urls import is_url as _is_url

    return _is_url(path)


def check_url(url: str) -> str:
    from stoker.storage.urls import check_url as _check_url

    return _check_url(url)


def join_under(base_url: str, rel: str, *, manifest: str, field: str) -> str:
    from stoker.storage.urls import join_under as _join_under

    return _join_under(base_url, rel, manifest=manifest, field=field)


def redact(text: str) -> str:
    from stoker.storage.urls import redact as _redact

    return _redact(text)


__all__ = [
    "REMOTE_KEYWORDS",
    "RemoteFiles",
    "RemoteOptions",
    "ReadPlan",
    "check_room_for",
    "claim_plan",
    "claim_shards",
    "fits_all",
    "with_marks",
    "is_url",
    "local_path",
    "remote_url",
]

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")

#: The keyword arguments that say how remote data is reached and cached, wherever a path is
#: taken (``Loader``, ``RecordDataset``, ``stoker.formats.open``): :class:`RemoteOptions`.
REMOTE_KEYWORDS = ("storage_options", "cache_dir", "cache_limit", "prefetch_shards", "allow_hosts")


@dataclass(frozen=True)
class RemoteOptions:
    """How stoker reaches and caches remote data.

    ``storage_options``: passed to ``fsspec.filesystem`` (credentials, ``endpoint_url``, ...);
    without it credentials come from the standard places (``AWS_*`` variables, including
    ``AWS_ENDPOINT_URL``, and ``~/.aws``). ``cache_dir``: the shard cache's folder (default:
    ``<stoker cache dir>/shards``, see ``stoker._core.cache``). ``cache_limit``: its byte
    budget (default: the smaller of 100 GiB and half the free space where it lives).
    ``prefetch_shards``: shards downloaded ahead of the reading order (0: none).
    ``allow_hosts``: the hosts (an S3 or GCS bucket, ``HOST`` or ``HOST:PORT``) besides the
    manifest's own that a manifest may name files on, by absolute URL (``docs/remote.md``).
    ``whole_set``: the loader reads from any shard in any batch (its default sampler with
    ``shuffle=True``, a global shuffle): a set the cache's budget cannot hold whole is refused
    at open, before any download. ``loader``: a loader opens the set and claims the room its
    run reads in; until then its process reads one shard at a time, in the run's claim group
    (``docs/remote.md``).
    """

    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    cache_dir: str | None = None
    cache_limit: int | None = None
    prefetch_shards: int = 2
    allow_hosts: tuple[str, ...] = ()
    whole_set: bool = field(default=False, repr=False, compare=False)
    loader: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        so = self.storage_options
        if so is not None and not isinstance(so, Mapping):
            raise TypeError("storage_options must be a dict of fsspec options")
        if self.cache_dir is not None:
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
        lim = self.cache_limit
        if lim is not None and (isinstance(lim, bool) or not isinstance(lim, int) or lim <= 0):
            raise ValueError(f"cache_limit must be a positive number of bytes, got {lim!r}")
        ahead = self.prefetch_shards
        if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 0:
            raise ValueError(f"prefetch_shards must be an int >= 0, got {ahead!r}")
        hosts = (self.allow_hosts,) if isinstance(self.allow_hosts, str) else self.allow_hosts
        if not all(isinstance(h, str) and h and "/" not in h for h in hosts):
            raise ValueError(f"allow_hosts must be host names, got {self.allow_hosts!r}")
        object.__setattr__(self, "allow_hosts", tuple(h.lower() for h in hosts))

    def cache(self) -> ShardCache:
        from stoker.storage.cache import ShardCache

        return ShardCache(self.cache_dir, self.cache_limit)


def _key(url: str, size: int, crc: int | None, sha256: str | None = None) -> str:
    """The cache key of one object: its URL (without credentials), size and CRC (or sha256),
    hashed, and its base name for a reader of the cache folder."""
    check = f"{crc}" if sha256 is None else f"{crc}\0{sha256}"
    digest = hashlib.sha256(f"{redact(url)}\0{size}\0{check}".encode()).hexdigest()[:32]
    base = _SAFE.sub("_", url.rsplit("/", 1)[-1])[-80:] or "object"
    return f"{digest}-{base}"


class RemoteFiles:
    """The files of one set in object storage (see the module docstring).

    Picklable: the URL, the options, the sizes listed at open and the path of the manifest's
    cached copy travel; the cache and the filesystem are made again where it lands.
    """

    def __init__(self, url: str, options: RemoteOptions | None = None) -> None:
        from stoker.storage.remote import Remote, storage_env

        self.url = check_url(url)
        self.options = options or RemoteOptions()
        local = self.url.startswith("file:")  # a local manifest naming files elsewhere
        self.remote = Remote(self.url, None if local else self.options.storage_options)
        self.cache = self.options.cache()
        self.sizes: dict[str, int] = {}  # URL -> size, from the folder listings
        self._copy: str | None = None
        self._joined: dict[str, str] = {}  # name -> URL, each name checked and joined once
        self._remotes: dict[str, Remote] = {_root(self.url): self.remote}  # scheme://host -> it
        self._env = storage_env()

    def __repr__(self) -> str:
        return f"RemoteFiles({redact(self.url)!r})"

    def __getstate__(self) -> dict:
        return {
            "url": self.url,
            "options": self.options,
            "sizes": self.sizes,
            "copy": self._copy,
            "env": self._env,
        }

    def __setstate__(self, state: dict) -> None:
        # A worker reaches storage as the process that opened the set did: the credential
        # and endpoint variables it saw travel with the set (a worker's environment is the
        # one its fork server started with, which may be older).
        for name, value in state["env"].items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        self.__init__(state["url"], state["options"])  # type: ignore[misc]
        self.sizes, self._copy = dict(state["sizes"]), state["copy"]

    # -- the manifest ------------------------------------------------------------------------
    def manifest_copy(self, *, max_bytes: int = MAX_MANIFEST_BYTES) -> str:
        """The local path of the manifest's copy: read from storage once per process that
        opens the set, then kept in the cache by content (workers read the same copy)."""
        if self._copy is not None and os.path.exists(self._copy):
            return self._copy
        data = self.remote.read_bytes(self.url, max_bytes=max_bytes)
        sha = hashlib.sha256(data).hexdigest()
        name = _SAFE.sub("_", self.url.rsplit("/", 1)[-1]) or "manifest.stoker.json"
        folder = os.path.join(self.cache.root, "manifests", sha[:32])
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            # ranks and workers of a node may copy the same manifest at once: same content
            with atomic_write(path, shared=True) as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(data)
        self._copy = path
        return path

    # -- the files it names ------------------------------------------------------------------
    def url_of(self, rel: str, field: str) -> str:
        """The URL of a name the manifest gives (refused when it leaves the manifest's folder;
        ``field`` names it in the error). Every shard open asks again: joined once per name."""
        url = self._joined.get(rel)
        if url is None:
            joined = self._elsewhere if is_url(rel) else partial(join_under, self.url)
            url = self._joined[rel] = joined(rel, manifest=redact(self.url), field=field)
        return url

    def _elsewhere(self, url: str, *, manifest: str, field: str) -> str:
        """An absolute URL the manifest names: on the manifest's own scheme and host, or on a
        host of ``allow_hosts``; never a local file or a metadata address."""
        try:
            url = check_url(url)
        except ValueError as e:
            raise ManifestError(f"{manifest}: the field {field!r} names {e}") from None
        root = _root(url)
        host = root.split("://")[1]
        hostname = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        allowed = {_root(self.url), *self.options.allow_hosts}
        if root.startswith("file:") or not allowed & {root, host, hostname}:
            raise ManifestError(
                f"{manifest}: the field {field!r} names {redact(url)}, on another storage "
                f"than the manifest's; to read it, name its host when opening "
                f"(allow_hosts=[{host!r}], or --allow-host {host})"
            )
        return url

    def _remote_for(self, url: str) -> Any:
        """The :class:`~stoker.storage.remote.Remote` of ``url``'s scheme and host (the
        manifest's, or an allowed host's, reached with the same ``storage_options``)."""
        root = _root(url)
        if root not in self._remotes:
            from stoker.storage.remote import Remote

            self._remotes[root] = Remote(root + "/", self.options.storage_options)
        return self._remotes[root]

    def list_sizes(self, urls: Iterable[str], *, missing_ok: bool = False) -> dict[str, int]:
        """The size of every URL (:meth:`~stoker.storage.remote.Remote.sizes`: a listing per
        folder, or a HEAD each where there is none); ``FileNotFoundError`` naming the first URL
        that is not there (``missing_ok``: those left out)."""
        by_root: dict[str, list[str]] = {}
        for u in urls:
            by_root.setdefault(_root(u), []).append(u)
        try:
            for group in by_root.values():
                self.sizes.update(self._remote_for(group[0]).sizes(group, missing_ok=missing_ok))
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f"{redact(self.url)}: the manifest names a file that does not exist ({e})"
            ) from None
        return self.sizes

    def size_of(self, url: str) -> int:
        size = self.sizes.get(url)
        if size is None:
            size = self.sizes[url] = self._remote_for(url).size(url)
        return size

    def key(self, url: str, *, crc32c: int | None = None, sha256: str | None = None) -> str:
        """The cache key of ``url`` (its URL, size and checksum): what its cached copy and
        anything derived from that copy (a format's index) are filed under."""
        return _key(url, self.size_of(url), crc32c, sha256)

    def item(
        self, url: str, *, crc32c: int | None = None, what: str = "", sha256: str | None = None
    ) -> Any:
        """The :class:`~stoker.storage.Item` that downloads ``url`` into the cache: its key
        (URL, size and checksum), size, CRC32C, name for messages, fetch and sha256."""
        from stoker.storage.ahead import Item

        size = self.size_of(url)
        return Item(
            _key(url, size, crc32c, sha256),
            size,
            crc32c,
            f"{what} ({redact(url)})" if what else redact(url),
            partial(self._remote_for(url).download, url, size=size, what=what),
            sha256,
        )

    def fetch(
        self, url: str, *, crc32c: int | None = None, what: str = "", sha256: str | None = None
    ) -> Pin:
        """A pinned, checked local copy of ``url`` (downloaded once per node)."""
        return self.item(url, crc32c=crc32c, what=what, sha256=sha256).get(self.cache)


def _root(url: str) -> str:
    """``scheme://host`` of a URL (a bucket for object stores), without credentials."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{rest.split('/', 1)[0].rsplit('@', 1)[-1].lower()}"


def check_room_for(files: RemoteFiles, sizes: list[int], marked: list[int]) -> None:
    """:class:`CacheFullError` at open when the cache cannot hold what reading needs at once:
    the shards a batch reads while the next ``prefetch_shards`` download (at least two shards
    beside those), for shards of ``sizes`` bytes each (their side files included); and, for a
    loader that reads from any shard (``RemoteOptions.whole_set``), every shard (``marked``:
    their sizes with the cache's markers)."""
    if not sizes:
        return
    need = min((files.options.prefetch_shards + 2) * max(sizes), sum(marked))
    limit = files.cache.limit
    if limit < need:
        raise CacheFullError(
            f"{redact(files.url)}: the shard cache's budget is {size_text(limit)}; reading this "
            f"set needs at least {size_text(need)} (its largest shard, {size_text(max(sizes))} "
            f"with its side files, times prefetch_shards={files.options.prefetch_shards} + 2). "
            "Raise cache_limit, or lower prefetch_shards"
        )
    if files.options.whole_set and sum(marked) > limit:
        raise CacheFullError(
            f"{redact(files.url)} read with shuffle=True needs {size_text(sum(marked))} of the "
            f"shard cache {files.cache.root}, and its budget is {size_text(limit)}. "
            + _whole_set_fixes("shuffle=True", marked)
        )


def _whole_set_fixes(order: str, sizes: list[int]) -> str:
    return (
        f"{order} reads from any shard in any batch, so the cache must hold the whole set "
        f"({size_text(sum(sizes))} in {len(sizes)} shards). Raise cache_limit to at least "
        'that, or use shuffle="shards" (a few shards at a time)'
    )


@dataclass(frozen=True)
class ReadPlan:
    """How one loader reads a remote set, for the room it claims (:func:`claim_shards`).

    ``span``: at most how many shards the batches being made at once touch (a sampler's
    ``shard_span`` of the records in flight; ``None``: any shard, an order that draws from the
    whole set). ``shared``: whether the ranks of the run read the same shards at once (a
    sequential order interleaves them) rather than shards of their own. ``order``: the order
    as the user named it, and ``run``: who reads (ranks, workers), both for messages.
    """

    span: int | None
    shared: bool
    order: str
    run: str


def with_marks(sizes: list[int], files: int) -> list[int]:
    """Each shard's bytes with the verification markers of its ``files`` files."""
    from stoker.storage.cache import MARKER_RESERVE

    return [n + files * MARKER_RESERVE for n in sizes]


def claim_plan(
    files: RemoteFiles, sizes: list[int], plan: ReadPlan, whole: bool
) -> tuple[Any, int, bool]:
    """A loader's claim (:func:`claim_shards`). When the cache's budget holds the whole set
    (``whole``: its readers then keep every shard they open pinned), the whole set is claimed,
    so that those pins are what the claim says; when other readers' claims leave no room for
    that, the plan's own room, and the readers keep only what it allows. Returns the claim,
    how many shards a reader may keep pinned, and whether the whole set was claimed."""
    if whole:
        try:
            claim, pinned = claim_shards(files, sizes, replace(plan, span=None))
            return claim, pinned, True
        except CacheFullError:
            pass
    claim, pinned = claim_shards(files, sizes, plan)
    return claim, pinned, False


def claim_shards(files: RemoteFiles, sizes: list[int], plan: ReadPlan) -> tuple[Any, int]:
    """Claim the room a loader needs at once in the node's shard cache, or raise
    :class:`CacheFullError` at open naming the bytes, the budget and the fixes
    (``docs/remote.md``, "How much cache a run needs"). Returns the claim and how many shards
    a reader may keep pinned (every one when the claim is the whole set); a reader caps that
    by what it may keep open at all.

    The pins of a loader lie in the shards its batches in flight touch (``plan.span``; each
    reader pins only what its current chunk reads) and the ``prefetch_shards`` downloaded
    ahead: ``(span + prefetch_shards) x`` the largest shard, never more than the whole set.
    An order that may touch any shard (``shuffle=True``, class-balanced) needs the whole set.
    Every claim of one run on the set is in one group (:func:`~stoker.storage.claims.
    run_group`): ranks reading shards of their own add up, ranks reading the same shards count
    once, and the group counts at most the whole set. ``sizes``: each shard's bytes in the
    cache, its files' markers included (:func:`with_marks`)."""
    from stoker.storage.claims import run_group

    whole = sum(sizes)
    ahead = files.options.prefetch_shards
    url = redact(files.url)
    if plan.span is None or plan.span + ahead >= len(sizes):
        need, per_reader, shared = whole, len(sizes), True
        if plan.span is None:
            fixes = _whole_set_fixes(plan.order, sizes)
        else:
            fixes = f"Raise cache_limit to at least {size_text(whole)} (the whole set)"
    else:
        need = min((plan.span + ahead) * max(sizes), whole)
        per_reader, shared = plan.span, plan.shared
        if plan.order == BY_POSITION:
            fixes = (
                f"A process that reads the set outside a stoker.Loader (a RecordDataset in each "
                f"DataLoader worker) keeps up to {plan.span + ahead} shards of up to "
                f"{size_text(max(sizes))} open. Raise cache_limit, use fewer DataLoader workers, or "
                "lower prefetch_shards="
            )
        else:
            fixes = (
                f"The batches in flight touch up to {plan.span} shards and {ahead} are "
                f"downloaded ahead, each up to {size_text(max(sizes))}. Raise cache_limit to "
                f"at least {size_text(need)}, or lower prefetch_shards=, prefetch= or the batch size, or a "
                "ShardOrder's window"
            )
            if plan.order != 'shuffle="shards"':
                fixes += ', or use shuffle="shards"'
    what = f"{url} read with {plan.order} ({plan.run})"
    claim = files.cache.claim(
        need, what=what, group=run_group(url), fixes=fixes, shared=shared, cap=whole
    )
    return claim, per_reader


#: ``ReadPlan.order`` of a process that reads a set by position outside a loader.
BY_POSITION = "reads by position"


def fits_all(files: RemoteFiles, sizes: list[int]) -> bool:
    """Whether the cache's budget holds every shard of ``sizes`` (markers included) and one
    more shard."""
    if not sizes:
        return False
    return sum(sizes) + max(sizes) <= files.cache.limit


def local_path(path: str) -> str:
    """A ``file://`` URL as the local path it names; anything else unchanged."""
    if is_url(path) and check_url(path).startswith("file://"):
        from urllib.parse import unquote, urlsplit

        parts = urlsplit(path)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"{path}: a file:// URL names a local path (file:///abs/path)")
        return unquote(parts.path)
    return path


def remote_url(path: Any) -> str | None:
    """``path`` as a URL when it is one other than ``file://`` (which is read in place)."""
    if not is_url(path):
        return None
    url = check_url(path)
    return None if url.startswith("file://") else url
