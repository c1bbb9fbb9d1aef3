"""Which URLs stoker reads, how a manifest's names become URLs, and credentials out of text.

A manifest is untrusted input: the shard names it gives must stay under the manifest's own
folder, on the same scheme and bucket or host. :func:`join_under` is the one place that turns
such a name into a URL, and it refuses everything else (another scheme or bucket, an absolute
path, ``..`` in any spelling, a query). :func:`check_url` refuses schemes outside
:data:`SCHEMES` (``pipe:``, ``ftp://``, ``data:``) and link-local or cloud metadata hosts, so a
manifest or a user's typo cannot point a reader at ``169.254.169.254``.

:func:`redact` takes credentials out of any text shown to a user: userinfo in URLs, the
signature and token parameters of presigned S3, GCS and Azure SAS URLs, and the values of the
AWS credential variables in the environment.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from urllib.parse import unquote, urlsplit

from stoker._core.errors import ManifestError

__all__ = ["SCHEMES", "check_url", "is_url", "join_under", "redact"]

SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss", "http", "https", "file", "memory")

_URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
_SCHEME_PREFIX_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# Cloud metadata endpoints reachable by name; their addresses are link-local anyway.
_METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})
_EC2_IPV6_METADATA = ipaddress.ip_address("fd00:ec2::254")
# Schemes whose "user@" part names a container, not a credential (abfs://container@account).
_CONTAINER_USERINFO = frozenset({"az", "abfs", "abfss"})


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for ``<scheme>://...`` strings, whatever the scheme (a refused scheme is still a URL,
    so it is checked and refused rather than read as a local path); False for local paths,
    relative ones and ``C:\\x`` included."""
    if not isinstance(path, str):
        return False
    return _URL_RE.match(path) is not None


def _host_is_forbidden(host: str) -> bool:
    """A link-local address (169.254.0.0/16, fe80::/10), the EC2 IPv6 metadata address or a
    metadata host name, in any spelling of the address (``0xa9fea9fe``, ``2852039166``)."""
    host = host.strip("[]").rstrip(".").lower()
    if host in _METADATA_HOSTS:
        return True
    addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None = None
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        if re.fullmatch(r"[0-9a-fx.]+", host):
            try:  # the legacy forms a resolver accepts: decimal, hex, octal, short dotted
                addr = ipaddress.IPv4Address(socket.inet_aton(host))
            except OSError:
                addr = None
    if addr is None:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_link_local or addr == _EC2_IPV6_METADATA


def check_url(url: str) -> str:
    """The URL, normalised (lower-case scheme, and host for http/https), when stoker may read
    it; ValueError naming the URL (credentials removed) otherwise."""
    if not isinstance(url, str):
        raise TypeError(f"a URL must be a str, got {type(url).__name__}")
    m = _URL_RE.match(url)
    if m is None:
        raise ValueError(
            f"{redact(url)!r} is not a URL (expected <scheme>://...; schemes: {', '.join(SCHEMES)})"
        )
    scheme, rest = m.group(1).lower(), m.group(2)
    if scheme not in SCHEMES:
        raise ValueError(
            f"{redact(url)!r}: the scheme {scheme!r} is not allowed; stoker reads only "
            f"{', '.join(SCHEMES)}"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise ValueError(f"{redact(url)!r}: a URL must not contain control characters")
    netloc = rest.split("/", 1)[0]
    if scheme == "file":
        host = netloc.lower()
        if host not in ("", "localhost"):
            raise ValueError(
                f"{redact(url)!r}: a file:// URL names no host (file:///absolute/path)"
            )
        return f"file://{rest}"
    if scheme == "memory":
        return f"memory://{rest}"
    if not netloc:
        raise ValueError(
            f"{redact(url)!r} names no bucket or host (expected {scheme}://BUCKET/path)"
        )
    try:
        host = urlsplit(f"{scheme}://{rest}").hostname or ""
    except ValueError as e:
        raise ValueError(f"{redact(url)!r}: malformed host ({e})") from None
    if _host_is_forbidden(host) or _host_is_forbidden(netloc.rsplit("@", 1)[-1]):
        raise ValueError(
            f"{redact(url)!r}: refusing a link-local or cloud metadata address; data never "
            "comes from there"
        )
    if scheme in ("http", "https"):
        userinfo, at, hostport = netloc.rpartition("@")
        rest = f"{userinfo}{at}{hostport.lower()}{rest[len(netloc) :]}"
    return f"{scheme}://{rest}"


def _refuse(manifest: str, field: str, rel: object, reason: str) -> ManifestError:
    return ManifestError(
        f"{redact(manifest)}: the field {field!r} names {redact(repr(rel))}, which {reason}; "
        "a manifest names its files relative to its own folder (for example "
        "'train-00000.rec'), on the same storage"
    )


def _rel_problem(rel: str) -> str | None:
    """Why ``rel`` is not a plain relative name under a folder, or None."""
    if rel == "":
        return "is empty"
    forms = [rel]
    for _ in range(3):  # percent-encoding, also encoded twice or three times
        decoded = unquote(forms[-1])
        if decoded == forms[-1]:
            break
        forms.append(decoded)
    for form in forms:
        if "\x00" in form:
            return "contains a NUL byte"
        if any(ord(c) < 32 or ord(c) == 127 for c in form):
            return "contains a control character"
        if "?" in form or "#" in form:
            return "contains a '?' or '#' (a query or fragment)"
        if form.startswith(("/", "\\")):
            return "is an absolute path"
        if "\\" in form:
            return "contains a backslash"
        if _SCHEME_PREFIX_RE.match(form) or "://" in form:
            return "has a scheme or drive (another storage)"
        segments = form.split("/")
        if ".." in segments:
            return "contains a '..' segment (it would leave the manifest's folder)"
        if "" in segments:
            return "contains an empty path segment ('//' or a trailing '/')"
    return None


def join_under(base_url: str, rel: str, *, manifest: str, field: str) -> str:
    """The URL (or local path, when ``base_url`` is one) of the name ``rel`` a manifest gives,
    in the folder of ``base_url``. ManifestError naming ``manifest`` and ``field`` when ``rel``
    is anything but a plain relative name (see the module docstring)."""
    if not isinstance(rel, str):
        raise _refuse(manifest, field, rel, "is not a string")
    problem = _rel_problem(rel)
    if problem is not None:
        raise _refuse(manifest, field, rel, problem)
    parts = [s for s in rel.split("/") if s != "."]
    if not parts:
        raise _refuse(manifest, field, rel, "names the folder itself, not a file")
    clean = "/".join(parts)
    if not is_url(base_url):
        folder = os.path.dirname(os.path.abspath(base_url))
        joined = os.path.join(folder, *parts)
        if os.path.commonpath([folder, joined]) != folder:  # guarded above; kept as a check
            raise _refuse(manifest, field, rel, "leaves the manifest's folder")
        return joined
    base = check_url(base_url)
    scheme, rest = base.split("://", 1)
    if "/" in rest:
        folder_url = base[: base.rindex("/") + 1]
    else:
        folder_url = base + "/"
    joined = check_url(folder_url + clean)
    if joined.split("://", 1)[1].split("/", 1)[0] != rest.split("/", 1)[0]:
        raise _refuse(manifest, field, rel, "leaves the manifest's bucket or host")
    return joined


# Query parameters that carry a signature, a credential or a token. The long, distinctive
# names are redacted wherever they appear (also in an Authorization header); the short ones
# (Azure SAS's sig/se/sp/..., key, token) only as a query parameter after '?', '&' or ';'.
_SECRET_PARAMS_ANYWHERE = (
    "X-Amz-Signature",
    "X-Amz-Credential",
    "X-Amz-Security-Token",
    "X-Goog-Signature",
    "X-Goog-Credential",
    "GoogleAccessId",
    "AWSAccessKeyId",
    "Signature",
    "Credential",
    "access_token",
    "Key-Pair-Id",
    "Policy",
)
_SECRET_PARAMS_QUERY = (
    "sig", "se", "st", "sp", "sv", "sr", "srt", "ss", "spr", "skoid", "sktid", "skt", "ske",
    "sks", "skv", "token", "key", "Expires",
)  # fmt: skip
# a value ends at the next parameter, whitespace, a quote or bracket, or a ':' that ends a clause
_VALUE = r"(?:[^&\s#\"'<>,;:]|:(?![\s:]|$))*"
_ANYWHERE_RE = re.compile(
    r"(?<![A-Za-z0-9_-])((?:" + "|".join(map(re.escape, _SECRET_PARAMS_ANYWHERE)) + r")=)" + _VALUE,
    re.IGNORECASE,
)
_QUERY_RE = re.compile(
    r"([?&;](?:" + "|".join(map(re.escape, _SECRET_PARAMS_QUERY)) + r")=)" + _VALUE,
    re.IGNORECASE,
)
_USERINFO_RE = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*)://([^/\s@?#'\"<>]+)@")
_ENV_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


def _redact_userinfo(m: re.Match[str]) -> str:
    scheme, userinfo = m.group(1), m.group(2)
    if scheme.lower() in _CONTAINER_USERINFO and ":" not in userinfo:
        return m.group(0)  # abfs://container@account: a container name, not a credential
    return f"{scheme}://***@"


def redact(text: str) -> str:
    """``text`` with credentials replaced by ``***`` (see the module docstring). Idempotent."""
    text = str(text)
    for name in _ENV_SECRETS:
        value = os.environ.get(name, "")
        if len(value) > 3 and value in text:
            text = text.replace(value, "***")
    if "=" in text:
        text = _ANYWHERE_RE.sub(r"\1***", text)
        text = _QUERY_RE.sub(r"\1***", text)
    if "://" in text and "@" in text:
        text = _USERINFO_RE.sub(_redact_userinfo, text)
    return text
