"""Which storage faults are worth another try, and how long to wait before it.

:class:`RetryPolicy` is the bounded schedule: ``retries`` attempts after the first, the n-th
delay drawn uniformly from ``[0, min(cap, backoff * 2**n)]`` ("full jitter", so many readers
that failed together do not come back together). :func:`classify` sorts an exception into
``"transient"`` (retry: a dropped or reset connection, a timeout or stall, HTTP 500/502/503/504,
S3's ``SlowDown``, a short body), ``"missing"`` (404: raise FileNotFoundError at once),
``"denied"`` (401/403, missing or expired credentials: raise PermissionError at once, so a job
without credentials fails in well under two seconds) and ``"permanent"`` (anything else).

fsspec backends wrap the transport's exceptions (s3fs turns botocore's ``ClientError`` into an
``OSError`` whose ``__cause__`` holds it), so the whole cause chain is looked at, by class name
and status code; nothing here imports a backend.
"""

from __future__ import annotations

import errno
import random
from dataclasses import dataclass

__all__ = ["RetryPolicy", "ShortReadError", "cause_chain", "classify"]

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_DENIED_STATUS = frozenset({401, 403})
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
     "ThrottlingException", "RequestTimeTooSkewed", "503", "500"}
)  # fmt: skip
_DENIED_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
     "InvalidToken", "TokenRefreshRequired", "AccountProblem", "AllAccessDisabled"}
)  # fmt: skip
_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "404", "NotFound"})
# Exception class names (anywhere in the MRO) of the transports fsspec backends use.
_TRANSIENT_NAMES = frozenset(
    {
        "ConnectionError", "TimeoutError", "IncompleteRead", "ClientPayloadError",
        "ClientConnectionError", "ServerDisconnectedError", "ServerTimeoutError",
        "ClientOSError", "EndpointConnectionError", "ConnectionClosedError",
        "ReadTimeoutError", "ConnectTimeoutError", "ResponseStreamingError",
        "HTTPClientError", "FSTimeoutError", "ShortReadError", "ContentLengthError",
        "TransferEncodingError", "ResponseParserError",
    }
)  # fmt: skip
_DENIED_NAMES = frozenset(
    {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
     "NoAuthTokenError", "UnauthorizedSSOTokenError", "TokenRetrievalError", "PermissionError",
     "DefaultCredentialsError", "RefreshError"}
)  # fmt: skip


class ShortReadError(OSError):
    """A response body shorter (or longer) than the byte range asked for."""


@dataclass(frozen=True)
class RetryPolicy:
    """``retries`` attempts after the first; the n-th wait (n from 0) is uniform in
    ``[0, min(cap, backoff * 2**n)]`` seconds."""

    retries: int = 5
    backoff: float = 0.2
    cap: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {self.retries!r}")
        if not self.backoff >= 0 or not self.cap >= 0:
            raise ValueError(
                f"backoff and cap must be >= 0 seconds, got {self.backoff!r}, {self.cap!r}"
            )

    def delay(self, n: int, rng: random.Random | None = None) -> float:
        """The wait before retry ``n`` (0 for the first retry)."""
        ceiling = min(self.cap, self.backoff * (2.0 ** min(n, 62)))
        return (rng or random).uniform(0.0, ceiling)


def cause_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes (``__cause__``, else ``__context__``), at most 16, each once."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(seen) < 16 and all(cur is not s for s in seen):
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    """HTTP status and error code of a botocore ClientError or an aiohttp response error."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata") or {}
        err = response.get("Error") or {}
        status = meta.get("HTTPStatusCode")
        return (status if isinstance(status, int) else None), err.get("Code")
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return (status if isinstance(status, int) and 100 <= status < 600 else None), None


def classify(exc: BaseException) -> str:
    """``"transient"``, ``"missing"``, ``"denied"`` or ``"permanent"`` (module docstring)."""
    chain = cause_chain(exc)
    # The root cause first: fsspec's HTTP backend turns any failed HEAD, a 503 too, into a
    # FileNotFoundError whose cause is the real answer.
    for e in reversed(chain):
        status, code = _status_and_code(e)
        names = {c.__name__ for c in type(e).__mro__}
        if code in _DENIED_CODES or status in _DENIED_STATUS or names & _DENIED_NAMES:
            return "denied"
        if code in _MISSING_CODES or status == 404 or isinstance(e, FileNotFoundError):
            return "missing"
        if code in _TRANSIENT_CODES or status in _TRANSIENT_STATUS:
            return "transient"
    for e in chain:
        names = {c.__name__ for c in type(e).__mro__}
        if names & _TRANSIENT_NAMES:
            return "transient"
        if isinstance(e, OSError) and e.errno in (errno.EBUSY, errno.EREMOTEIO, errno.ETIMEDOUT):
            return "transient"
        if "SlowDown" in str(e) or "reduce your request rate" in str(e):
            return "transient"
    return "permanent"
