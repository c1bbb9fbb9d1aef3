"""Real storage on loopback for tests and benchmarks (test code, not part of the package): an S3
server, a static HTTP server and a fault-injecting proxy.

:class:`S3Server` is moto's S3 server (``moto[server]``, a development dependency) on
``127.0.0.1`` and a free port, in a thread of this process or (``process=True``, the tests'
session server) in a child process. The thread-mode instances of one process share moto's
in-memory state; tests use a bucket or prefix of their own. :meth:`S3Server.env`
gives distinctive fake credentials and the endpoint for ``os.environ`` or a child process.

:class:`FaultProxy` is an HTTP/1.1 forwarding proxy in front of such an endpoint; point a
client at :attr:`FaultProxy.endpoint` instead of the server's. Each request is forwarded on a
fresh connection and its response sent back with ``Connection: close`` (no keep-alive, so a
fault never leaks into the next request). Per request it adds ``latency`` seconds, caps body
bytes at ``bandwidth`` bytes/s, and applies the next injected fault whose ``match`` is in the
request's path:

- ``"reset"``: send the headers and ``after_bytes`` of the body, then reset the connection (RST);
- ``"truncate"``: send the full ``Content-Length`` header but only ``after_bytes`` of the body
  (half of it when ``after_bytes`` is 0), then close;
- ``"stall"``: send the headers and ``after_bytes`` of the body, then nothing until the proxy
  stops;
- ``"503"`` / ``"slowdown"`` / ``"404"`` / ``"403"``: answer at once with that status and S3's
  error XML (``ServiceUnavailable``, ``SlowDown``, ``NoSuchKey``, ``InvalidAccessKeyId``)
  without forwarding.

Everything runs in threads; :meth:`FaultProxy.stop` ends stalled responses and joins them.

:class:`StaticServer` is ``python -m http.server`` serving a folder, in a process of its own:
what a plain static HTTP server gives (an HTML folder index without sizes, no ``Range``).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["FaultProxy", "S3Server", "Served", "StaticServer"]

# Distinctive values, so a test can assert that none of them appears in any output.
FAKE_ACCESS_KEY_ID = "STOKERFAKEKEYID7Q2XW"
FAKE_SECRET_ACCESS_KEY = "stokerFakeSecret/9vQ3mZ1kP7wX+hT4"


class S3Server:
    """moto's S3 server on 127.0.0.1 and a free port, in a thread of this process, or with
    ``process=True`` in a child process of its own (:class:`Served`): its request threads then
    do not take turns with the client's on this process's interpreter lock."""

    def __init__(self, *, process: bool = False) -> None:
        self._server: Any = None
        self._port: int | None = None
        self._process = process

    def start(self) -> S3Server:
        if self._server is not None:
            return self
        if self._process:
            self._server = served = Served()
            self._port = int(served.endpoint.rsplit(":", 1)[1])
            return self
        from moto.server import ThreadedMotoServer  # a development dependency

        # werkzeug logs every request at INFO on stderr; keep its warnings and errors only
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        self._server = server
        self._port = server.get_host_and_port()[1]
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        if isinstance(server, Served):
            server.close()
            return
        server.stop()
        inner = getattr(server, "_server", None)
        if inner is not None:
            inner.server_close()  # stop() leaves the listening socket open

    @property
    def endpoint(self) -> str:
        if self._port is None:
            raise RuntimeError("S3Server.start() first")
        return f"http://127.0.0.1:{self._port}"

    def env(self) -> dict[str, str]:
        """Environment for clients of this server: fake credentials, endpoint, region, and no
        probing of the EC2 metadata service for credentials."""
        return {
            "AWS_ACCESS_KEY_ID": FAKE_ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": FAKE_SECRET_ACCESS_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def upload_tree(folder: str | os.PathLike[str], url: str) -> None:
    """Every file under ``folder`` to ``url`` + its relative path, in one concurrent ``put`` of
    the URL's file system (a set's shards go up at once, not one request after another)."""
    from stoker.storage.remote import Remote

    root = os.fspath(folder)
    local = sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names)
    fs = Remote(url).fs()
    bare = url.split("://", 1)[1].rstrip("/")
    fs.put(local, [f"{bare}/{os.path.relpath(p, root).replace(os.sep, '/')}" for p in local])


class StaticServer:
    """``python -m http.server`` serving ``folder`` on 127.0.0.1 and a free port (see the
    module docstring); :attr:`url` is the folder's URL once started."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = os.fspath(folder)
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> StaticServer:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        self._proc = proc = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
            cwd=self.folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("python -m http.server did not start") from None
                time.sleep(0.05)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.terminate()
            proc.wait(10)

    def __enter__(self) -> StaticServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_KINDS = ("reset", "truncate", "stall", "503", "slowdown", "404", "403")
_ERRORS = {
    "503": (503, "Service Unavailable", "ServiceUnavailable", "Please reduce your request rate."),
    "slowdown": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    "404": (404, "Not Found", "NoSuchKey", "The specified key does not exist."),
    "403": (
        403,
        "Forbidden",
        "InvalidAccessKeyId",
        "The AWS Access Key Id you provided does not exist in our records.",
    ),
}
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
     "upgrade", "content-length"}
)  # fmt: skip


@dataclass
class _Fault:
    kind: str
    times: int
    match: str
    after_bytes: int
    skip: int


class _Handler(socketserver.BaseRequestHandler):
    server: _ProxyServer

    def handle(self) -> None:
        proxy = self.server.proxy
        sock: socket.socket = self.request
        proxy._track(sock, True)
        sock.settimeout(60.0)  # a client that sends nothing cannot hold a thread for ever
        try:
            rfile = sock.makefile("rb")
            try:
                proxy._serve_one(sock, rfile)
            finally:
                rfile.close()
        except OSError:
            pass
        finally:
            proxy._track(sock, False)


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True
    proxy: FaultProxy


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of ``target`` (see the module docstring)."""

    def __init__(self, target: str, *, latency: float = 0.0, bandwidth: float | None = None):
        host_port = target.split("://", 1)[-1].split("/", 1)[0]
        host, _, port = host_port.rpartition(":")
        self._target = (host or "127.0.0.1", int(port or 80))
        self.latency = float(latency)
        self.bandwidth = None if bandwidth is None else float(bandwidth)
        self.requests: list[tuple[str, str, str | None]] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._open: set[socket.socket] = set()
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        if self._server is not None:
            return self
        self._stopping.clear()
        server = _ProxyServer(("127.0.0.1", 0), _Handler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        with self._lock:
            for s in list(self._open):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        server.server_close()  # joins the handler threads
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("FaultProxy.start() first")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def inject(
        self, kind: str, *, times: int = 1, match: str = "", after_bytes: int = 0, skip: int = 0
    ) -> None:
        """Apply ``kind`` to the next ``times`` requests whose path contains ``match``, after
        letting ``skip`` such requests through untouched."""
        if kind not in _KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(_KINDS)}")
        with self._lock:
            self._faults.append(_Fault(kind, int(times), match, int(after_bytes), int(skip)))

    def clear(self) -> None:
        """Forget the faults not applied yet and the request log."""
        with self._lock:
            self._faults.clear()
            self.requests.clear()

    # -- one connection, one request ---------------------------------------------------------
    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._open.add(sock)
            else:
                self._open.discard(sock)

    def _take_fault(self, path: str) -> _Fault | None:
        with self._lock:
            for f in self._faults:
                if f.times > 0 and f.match in path:
                    if f.skip > 0:
                        f.skip -= 1
                        return None
                    f.times -= 1
                    return f
        return None

    def _throttle(self, nbytes: int, started: float, sent: int) -> None:
        if self.bandwidth:
            wait = started + (sent + nbytes) / self.bandwidth - time.monotonic()
            if wait > 0:
                self._stopping.wait(wait)

    def _serve_one(self, sock: socket.socket, rfile: Any) -> None:
        line = rfile.readline(65537)
        if not line:
            return
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers: list[tuple[str, str]] = []
        while True:
            h = rfile.readline(65537)
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        lower = {k.lower(): v for k, v in headers}
        if lower.get("expect", "").lower() == "100-continue":
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            headers = [(k, v) for k, v in headers if k.lower() != "expect"]
        body = b"".join(self._read_body(rfile, lower))
        with self._lock:
            self.requests.append((method, path, lower.get("range")))
        if self.latency:
            self._stopping.wait(self.latency)
        fault = self._take_fault(path)
        if fault is not None and fault.kind in _ERRORS:
            self._send_error(sock, fault.kind, path, head_only=method == "HEAD")
            return
        status, reason, out_headers, payload = self._forward(method, path, headers, body)
        head = [f"HTTP/1.1 {status} {reason}"]
        head += [f"{k}: {v}" for k, v in out_headers if k.lower() not in _HOP_BY_HOP]
        length = int(_header(out_headers, "content-length") or len(payload))
        if method != "HEAD":
            length = len(payload)
        head += [f"Content-Length: {length}", "Connection: close", "", ""]
        sock.sendall("\r\n".join(head).encode("latin-1"))
        if method == "HEAD":
            return
        limit = len(payload)
        if fault is not None and fault.kind == "truncate":
            limit = min(fault.after_bytes or len(payload) // 2, max(len(payload) - 1, 0))
        elif fault is not None:
            limit = min(fault.after_bytes, len(payload))
        self._send_body(sock, memoryview(payload)[:limit])
        if fault is None or fault.kind == "truncate":
            return
        if fault.kind == "stall":
            self._stopping.wait()
            return
        # reset: close with SO_LINGER 0, so the peer sees ECONNRESET
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def _read_body(self, rfile: Any, lower: dict[str, str]) -> Iterator[bytes]:
        if lower.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                yield rfile.read(size)
                rfile.readline(8)
        n = int(lower.get("content-length", "0") or 0)
        if n:
            yield rfile.read(n)

    def _forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self._target, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for k, v in headers:
                if k.lower() not in _HOP_BY_HOP:
                    conn.putheader(k, v)
            conn.putheader("Content-Length", str(len(body)))
            conn.putheader("Connection", "close")
            conn.endheaders(body)
            resp = conn.getresponse()
            payload = resp.read()
            return resp.status, resp.reason, resp.getheaders(), payload
        finally:
            conn.close()

    def _send_body(self, sock: socket.socket, data: memoryview) -> None:
        started, sent, step = time.monotonic(), 0, 64 * 1024
        while sent < len(data) and not self._stopping.is_set():
            piece = data[sent : sent + step]
            self._throttle(len(piece), started, sent)
            sock.sendall(piece)
            sent += len(piece)

    def _send_error(
        self, sock: socket.socket, kind: str, path: str, *, head_only: bool = False
    ) -> None:
        status, reason, code, message = _ERRORS[kind]
        body = (
            '<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{code}</Code><Message>{message}</Message>"
            f"<Resource>{path.split('?', 1)[0]}</Resource><RequestId>stoker-fault</RequestId></Error>"
        ).encode()
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode("latin-1") + (b"" if head_only else body))  # HEAD: no body


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


class Served:
    """This file run as a script (:func:`serve`) in a child process: the S3 server, or with
    ``--proxy-to`` a proxy in front of one, serving on a core of its own; its arguments are
    :func:`serve`'s. :attr:`endpoint` once started; :meth:`counts`, the proxy's requests."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise RuntimeError(f"storage_doubles.py {' '.join(args)} did not start")
        self.endpoint: str = json.loads(line)["endpoint"]

    def counts(self) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()  # serve() stops at the end of its input
        self.proc.stdout.close()
        self.proc.wait(30)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(argv: list[str] | None = None) -> int:
    """``python tests/storage_doubles.py [--proxy-to URL --latency S --bandwidth B]``: the S3
    server (or, with ``--proxy-to``, a :class:`FaultProxy` in front of that endpoint) in a
    process of its own, so that a benchmark's own process spends no time serving. Prints one
    JSON line ``{"endpoint": ...}``; then, for each line read on stdin, one JSON line
    ``{"requests": n, "gets": m}`` (what the proxy served so far); stops at end of input."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="python tests/storage_doubles.py")
    ap.add_argument("--proxy-to", default=None, metavar="URL")
    ap.add_argument("--latency", type=float, default=0.0, metavar="SECONDS")
    ap.add_argument("--bandwidth", type=float, default=None, metavar="BYTES_PER_S")
    args = ap.parse_args(argv)
    server: S3Server | FaultProxy
    if args.proxy_to:
        server = FaultProxy(args.proxy_to, latency=args.latency, bandwidth=args.bandwidth)
    else:
        server = S3Server()
    with server:
        print(json.dumps({"endpoint": server.endpoint}), flush=True)
        for _ in sys.stdin:
            seen = list(getattr(server, "requests", []))
            gets = sum(1 for r in seen if r[0] == "GET")
            print(json.dumps({"requests": len(seen), "gets": gets}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(serve())
