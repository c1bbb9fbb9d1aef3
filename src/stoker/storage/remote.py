"""One dataset root's storage: an fsspec filesystem with bounded retries and exact downloads.

:class:`Remote` holds the root URL, ``storage_options`` and the retry settings, nothing else,
so it pickles to worker processes; the filesystem is made lazily, once per process (and per
credential environment: a changed ``AWS_*`` variable makes a new one).

Retries live here, not in the backend. For S3 the filesystem's own retry loop is set to
one attempt (its ``retries`` attribute) and botocore's at one (``config_kwargs={"retries":
{"total_max_attempts": 1}}``), so :class:`~stoker.storage.retry.RetryPolicy` is the one
schedule. A stall is bounded by the transport's read timeout: for S3 ``config_kwargs``
``read_timeout`` and ``connect_timeout`` (aiobotocore makes them aiohttp's ``sock_read`` and
``sock_connect``), for HTTP(S) an ``aiohttp.ClientTimeout(sock_read=, sock_connect=)`` in
``client_kwargs``; both are set to :attr:`Remote.timeout` unless ``storage_options`` sets them.
A read that receives nothing for that long fails with a timeout, which is retried like a
reset connection.

:meth:`Remote.download` reads the object in byte ranges of :attr:`Remote.chunk` bytes
(``cat_file(path, start, end)``, one ranged GET each, no readahead cache) and writes each
range only once it has all of it, so after a fault it resumes at the first byte not yet
written: nothing is duplicated or skipped. The last range asks for one byte more than
``size``, so an object longer than the manifest says is caught without an extra request, and a
shorter one shows up as a short body. A server that ignores ``Range`` and sends the whole
object (of the expected size) is accepted: the bytes not yet written are taken from it.

HTTP(S) redirects are refused: the filesystem is made with ``allow_redirects=False`` and a
client whose trace hook turns any 3xx answer into an error naming the URL, so a server cannot
send a reader to another host.

Errors name the URL with credentials removed (:func:`~stoker.storage.urls.redact`), what was
being read and the byte range; ``storage_options`` never appears in a repr or a message.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TypeVar

from stoker._core.atomic import atomic_write
from stoker._core.errors import ManifestError, StorageError
from stoker.storage.retry import RetryPolicy, ShortReadError, cause_chain, classify
from stoker.storage.urls import check_url, is_url, redact

__all__ = ["Remote", "close_filesystems", "storage_env"]

T = TypeVar("T")

_FILESYSTEMS: dict[tuple[Any, ...], Any] = {}
_FS_LOCK = threading.Lock()
_CREDENTIAL_ENV_PREFIXES = ("AWS_", "GOOGLE_", "GCE_", "GCS", "AZURE_", "FSSPEC_")
_HTTP_HINT = (
    "the HTTP server refused the request: check that the URL is served to this machine, or "
    "pass what it asks for (headers, auth) in storage_options"
)
_CREDENTIAL_HINT = (
    "check the credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE and "
    "~/.aws/credentials), the storage's own variables, or storage_options"
)


class _RedirectRefused(Exception):
    """An HTTP(S) server answered with a redirect (3xx)."""

    def __init__(self, status: int, url: str, location: str) -> None:
        self.status, self.url, self.location = status, url, location
        super().__init__(f"HTTP {status} redirect from {url} to {location or '(no Location)'}")


async def _refuse_redirect(session: Any, ctx: Any, params: Any) -> None:
    status = params.response.status
    if 300 <= status < 400:
        location = params.response.headers.get("Location", "")
        params.response.close()
        raise _RedirectRefused(status, str(params.url), location)


async def _client_without_redirects(**kwargs: Any) -> Any:
    """fsspec's ``get_client`` for HTTP(S): an aiohttp session that refuses any 3xx."""
    import aiohttp

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(_refuse_redirect)
    return aiohttp.ClientSession(trace_configs=[trace], **kwargs)


def storage_env() -> dict[str, str]:
    """The environment variables storage backends read credentials and endpoints from: what
    a worker process (whose environment is its server's, which may be older) is given."""
    return {k: v for k, v in os.environ.items() if k.startswith(_CREDENTIAL_ENV_PREFIXES)}


def _credential_env() -> str:
    """A digest of :func:`storage_env`."""
    return hashlib.sha256(repr(sorted(storage_env().items())).encode()).hexdigest()


def _fs_options(protocol: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``storage_options`` plus the settings that make this module the one retry layer."""
    opts = dict(options)
    opts["skip_instance_cache"] = True
    if protocol == "s3":
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("connect_timeout", timeout)
        config.setdefault("read_timeout", timeout)
        config.setdefault("retries", {"total_max_attempts": 1})
        opts["config_kwargs"] = config
    elif protocol in ("http", "https"):
        try:
            import aiohttp
        except ImportError as exc:
            raise _missing_backend(protocol, exc) from None

        opts["allow_redirects"] = False
        opts["get_client"] = _client_without_redirects
        client = dict(opts.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(sock_connect=timeout, sock_read=timeout))
        opts["client_kwargs"] = client
    return opts


#: The package each scheme's fsspec backend needs beyond fsspec (``stoker[remote]`` installs
#: those of S3 and HTTP(S)).
_BACKENDS = {"s3": "s3fs", "http": "aiohttp", "https": "aiohttp", "gs": "gcsfs", "az": "adlfs"}


def _missing_backend(protocol: str, exc: ImportError) -> ImportError:
    package = _BACKENDS.get(protocol, "its fsspec backend")
    extra = 'pip install "stoker[remote]" (from a clone: pip install ".[remote]")'
    how = extra if protocol in ("s3", "http", "https") else f"pip install {package}"
    return ImportError(f"{protocol}:// URLs need {package}, which is not installed: {how}")


def _make_fs(protocol: str, options: Mapping[str, Any] | None, timeout: float) -> Any:
    try:
        import fsspec
    except ImportError as exc:
        raise _missing_backend(protocol, exc) from None

    key = (os.getpid(), protocol, repr(sorted((options or {}).items())), timeout, _credential_env())
    with _FS_LOCK:
        fs = _FILESYSTEMS.get(key)
        if fs is None:
            stale = [k for k in _FILESYSTEMS if k[0] != os.getpid()]
            for k in stale:  # made before a fork: the parent's sessions are not ours to use
                del _FILESYSTEMS[k]
            try:
                fs = fsspec.filesystem(
                    protocol, **_fs_options(protocol, dict(options or {}), timeout)
                )
            except ImportError as exc:
                raise _missing_backend(protocol, exc) from None
            if protocol == "s3":
                fs.retries = 1  # s3fs's own retry loop: one attempt; ours does the retrying
            _FILESYSTEMS[key] = fs
    return fs


def close_filesystems() -> None:
    """Close the connections of every filesystem this process made and forget them (tests
    call it so no socket outlives a test; the next call makes fresh ones)."""
    with _FS_LOCK:
        filesystems = [fs for k, fs in _FILESYSTEMS.items() if k[0] == os.getpid()]
        _FILESYSTEMS.clear()
    for fs in filesystems:
        loop = getattr(fs, "loop", None)
        s3creator = getattr(fs, "_s3creator", None)
        session = getattr(fs, "_session", None)
        with contextlib.suppress(Exception):  # closing is best effort
            if s3creator is not None and getattr(fs, "_s3", None) is not None:
                type(fs).close_session(loop, s3creator)
                fs._s3 = None
            elif session is not None and hasattr(type(fs), "close_session"):
                type(fs).close_session(loop, session)
                fs._session = None


@dataclass(frozen=True)
class Remote:
    """One dataset root's storage (see the module docstring). Picklable; the fsspec filesystem
    is made lazily per process. ``storage_options`` never shows in repr, str or errors."""

    root: str
    storage_options: Mapping[str, Any] | None = field(default=None, repr=False, hash=False)
    retries: int = 5
    backoff: float = 0.2
    timeout: float = 60.0
    chunk: int = 8 << 20

    def __post_init__(self) -> None:
        root = self.root
        if isinstance(root, os.PathLike) or (isinstance(root, str) and not is_url(root)):
            root = "file://" + os.path.abspath(os.fspath(root))
        object.__setattr__(self, "root", check_url(root))
        if self.storage_options is not None:
            if not isinstance(self.storage_options, Mapping):
                raise TypeError("storage_options must be a mapping of fsspec options")
            object.__setattr__(self, "storage_options", dict(self.storage_options))
        RetryPolicy(self.retries, self.backoff)  # checks retries and backoff
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise ValueError(f"chunk must be a positive number of bytes, got {self.chunk!r}")

    # -- plumbing ----------------------------------------------------------------------------
    @property
    def protocol(self) -> str:
        return self.root.split("://", 1)[0]

    @property
    def policy(self) -> RetryPolicy:
        return RetryPolicy(self.retries, self.backoff)

    def fs(self) -> Any:
        """The fsspec filesystem for this root, made once per process."""
        return _make_fs(self.protocol, self.storage_options, float(self.timeout))

    def _path(self, url: str) -> str:
        """The backend path of ``url``, which must be on this root's scheme and bucket/host."""
        if not is_url(url):
            url = "file://" + os.path.abspath(os.fspath(url))
        url = check_url(url)
        scheme, rest = url.split("://", 1)
        if (
            scheme != self.protocol
            or rest.split("/", 1)[0] != self.root.split("://", 1)[1].split("/", 1)[0]
        ):
            raise ValueError(
                f"{redact(url)} is not on the storage of {redact(self.root)}; a Remote reads "
                "one scheme and bucket/host"
            )
        if scheme in ("http", "https"):
            return url
        return str(self.fs()._strip_protocol(url))

    def _fail(self, exc: BaseException, url: str, what: str, doing: str) -> BaseException:
        """The error to raise for a fault that is not retried (or no longer)."""
        where = f"{what}: " if what else ""
        redirect = _find(exc, _RedirectRefused)
        if redirect is not None:
            return StorageError(
                f"{where}{redact(url)}: the server answered HTTP {redirect.status} (a redirect "
                f"to {redact(redirect.location) or 'nowhere'}); stoker does not follow "
                "redirects, so a server cannot send it to another host. Use the final URL."
            )
        cause = f"{type(exc).__name__}: {redact(str(exc))}"
        kind = classify(exc)
        if kind == "missing":
            return FileNotFoundError(f"{where}no object at {redact(url)} ({doing}; {cause})")
        if kind == "denied":
            hint = _HTTP_HINT if self.protocol in ("http", "https") else _CREDENTIAL_HINT
            return PermissionError(
                f"{where}{redact(url)}: access refused while {doing} ({cause}); {hint}"
            )
        return StorageError(f"{where}{redact(url)}: {doing} failed: {cause}")

    def _retrying(self, url: str, what: str, doing: str, fn: Callable[[], T]) -> T:
        policy, attempt = self.policy, 0
        while True:
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - sorted by classify()
                if _find(exc, _RedirectRefused) is not None or classify(exc) != "transient":
                    raise self._fail(exc, url, what, doing) from None
                if attempt >= policy.retries:
                    where = f"{what}: " if what else ""
                    raise StorageError(
                        f"{where}{redact(url)}: {doing} failed {attempt + 1} times; last error: "
                        f"{type(exc).__name__}: {redact(str(exc))}"
                    ) from None
                time.sleep(policy.delay(attempt))
                attempt += 1

    # -- the API -----------------------------------------------------------------------------
    def size(self, url: str) -> int:
        """The object's size in bytes; FileNotFoundError naming the URL when there is none."""
        path = self._path(url)
        info = self._retrying(url, "", "reading its size", lambda: self.fs().info(path))
        if info.get("type") == "directory":
            raise FileNotFoundError(f"no object at {redact(url)} (it is a folder)")
        size = info.get("size")
        if not isinstance(size, int):
            raise StorageError(f"{redact(url)}: the server does not report the object's size")
        return size

    def sizes(self, urls: list[str], *, missing_ok: bool = False) -> dict[str, int]:
        """The size of every URL. Object stores: one listing per folder, with a HEAD for an
        object the listing gives no size. HTTP(S): a HEAD per URL, several at once (a folder
        index is HTML without sizes, or refused, or absent). ``FileNotFoundError`` naming the
        first URL that is not there, or with ``missing_ok`` those URLs left out."""
        found: dict[str, int] = {}
        unknown: list[str] = []
        if self.protocol in ("http", "https"):
            unknown = list(dict.fromkeys(urls))
        else:
            by_folder: dict[str, list[str]] = {}
            for u in urls:
                by_folder.setdefault(u.rsplit("/", 1)[0], []).append(u)
            for folder, members in by_folder.items():
                listed = self.listing(folder)
                for u in members:
                    name = u.rsplit("/", 1)[-1]
                    if name not in listed:
                        if missing_ok:
                            continue
                        raise FileNotFoundError(f"no object at {redact(u)}")
                    size = listed[name]
                    if size is None:
                        unknown.append(u)
                    else:
                        found[u] = size
        if unknown:
            from concurrent.futures import ThreadPoolExecutor

            def size_or_none(u: str) -> int | None:
                try:
                    return self.size(u)
                except FileNotFoundError:
                    if missing_ok:
                        return None
                    raise

            with ThreadPoolExecutor(min(16, len(unknown))) as pool:
                for u, got in zip(unknown, pool.map(size_or_none, unknown), strict=True):
                    if got is not None:
                        found[u] = got
        return found

    def listing(self, folder_url: str) -> dict[str, int | None]:
        """Basename -> size of the objects directly in ``folder_url`` (one LIST); ``None``
        where the listing gives no size."""
        path = self._path(folder_url).rstrip("/")

        def ls() -> list[dict[str, Any]]:
            fs = self.fs()
            fs.invalidate_cache(path)
            return list(fs.ls(path, detail=True))

        entries = self._retrying(folder_url, "", "listing the folder", ls)
        return {
            str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: (
                int(e["size"]) if isinstance(e.get("size"), int) else None
            )
            for e in entries
            if e.get("type") == "file"
        }

    def read_bytes(self, url: str, *, max_bytes: int) -> bytes:
        """A whole small object (a manifest, an index); ManifestError when it is larger than
        ``max_bytes``, found before reading it."""
        size = self.size(url)
        if size > max_bytes:
            raise ManifestError(
                f"{redact(url)} is {size} bytes, more than the {max_bytes} bytes allowed for it; "
                "it is not a file stoker wrote"
            )
        buf = io.BytesIO()
        self.download(url, buf, size=size)
        return buf.getvalue()

    def download(self, url: str, out: BinaryIO, *, size: int, what: str = "") -> None:
        """Write exactly ``size`` bytes of the object to ``out`` (opened "wb", at 0), resuming
        after transient faults (module docstring); FileNotFoundError, PermissionError at once;
        StorageError after the retries."""
        path = self._path(url)
        fs, policy, attempt, pos = self.fs(), self.policy, 0, 0
        out.seek(0)
        out.truncate(0)
        if size == 0:
            got = self.size(url)
            if got != 0:
                raise ManifestError(
                    f"{what + ': ' if what else ''}{redact(url)} is {got} bytes, not 0"
                )
            return
        while True:
            end = min(pos + self.chunk, size)
            ask = end + 1 if end == size else end  # one byte past the end: longer object?
            try:
                data = fs.cat_file(path, start=pos, end=ask)
                if len(data) > ask - pos and len(data) == size:
                    out.write(data[pos:])  # a server without Range support sent it all
                    return
                if len(data) > end - pos:
                    raise ManifestError(
                        f"{what + ': ' if what else ''}{redact(url)} is longer than the "
                        f"{size} bytes expected"
                    )
                if len(data) < end - pos:
                    out.write(data)  # a short body: what came is good; ask for the rest
                    pos += len(data)
                    raise ShortReadError(f"got {len(data)} of {end - pos + len(data)} bytes")
            except ManifestError:
                raise
            except Exception as exc:  # noqa: BLE001 - sorted by classify()
                if _range_not_satisfiable(exc):  # the object ends before `pos`
                    exc = ShortReadError(f"the object ends before byte {pos}")
                if _find(exc, _RedirectRefused) is not None or classify(exc) != "transient":
                    raise self._fail(exc, url, what, f"reading bytes {pos}-{size}") from None
                if attempt >= policy.retries:
                    where = f"{what}: " if what else ""
                    raise StorageError(
                        f"{where}{redact(url)}: reading bytes {pos}-{size} of {size} failed "
                        f"{attempt + 1} times in a row; last error: {type(exc).__name__}: "
                        f"{redact(str(exc))}. The object may be shorter than expected, or the "
                        f"storage unreachable; retries={self.retries} and timeout={self.timeout} "
                        "set how long stoker keeps trying."
                    ) from None
                time.sleep(policy.delay(attempt))
                attempt += 1
                continue
            out.write(data)
            pos = end
            attempt = 0
            if pos >= size:
                return

    def upload(self, local_path: str, url: str) -> None:
        """Store the local file at ``url`` whole (an object store PUT is atomic; a local
        destination is written to a temporary name and renamed), retried like a download,
        and check the stored size."""
        path = self._path(url)
        want = os.path.getsize(local_path)

        def put() -> None:
            fs = self.fs()
            if self.protocol == "file":
                os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                with open(local_path, "rb") as src, atomic_write(path, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            else:
                fs.put_file(local_path, path)
                fs.invalidate_cache(path)

        self._retrying(url, "", "uploading", put)
        got = self.size(url)
        if got != want:
            raise StorageError(
                f"{redact(url)}: the stored object is {got} bytes, the local file {want}"
            )

    def exists(self, url: str) -> bool:
        path = self._path(url)

        def info() -> bool:
            try:
                self.fs().info(path)
            except FileNotFoundError as exc:
                if classify(exc) == "missing":  # not a 503 that the backend calls "not found"
                    return False
                raise
            return True

        return self._retrying(url, "", "looking it up", info)

    def remove(self, url: str) -> None:
        """Delete the object; a missing object is not an error."""
        path = self._path(url)

        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                self.fs().rm_file(path)

        self._retrying(url, "", "removing it", rm)


def _find(exc: BaseException, cls: type[BaseException]) -> Any:
    return next((e for e in cause_chain(exc) if isinstance(e, cls)), None)


def _range_not_satisfiable(exc: BaseException) -> bool:
    """HTTP 416: a range that starts at or past the end of the object."""
    for cur in cause_chain(exc):
        response = getattr(cur, "response", None)
        if isinstance(response, dict):
            if (response.get("Error") or {}).get("Code") == "InvalidRange":
                return True
            if (response.get("ResponseMetadata") or {}).get("HTTPStatusCode") == 416:
                return True
        if getattr(cur, "status", None) == 416:
            return True
    return False
