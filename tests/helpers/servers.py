"""Servers in a thread for the tests that talk over sockets: the product's HTTPS server with raw TLS
clients that send exactly the bytes a test says (bench/timeouts.py times the same clients), and a
TCP proxy a test can cut."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers.envtest import wait_until
from volcano_job_webhook.certs.reload import CertReloader
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.server.app import create_app
from volcano_job_webhook.server.connections import ConnectionGuard, ConnectionLimits
from volcano_job_webhook.server.https import HTTPSServer, build_server
from volcano_job_webhook.server.jobs import DirectoryJobSource

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def mutate_over_https(url: str, review: bytes, context: ssl.SSLContext, timeout: float = 10) -> dict[str, Any]:
    """POST ``review`` to ``url``/mutate; the AdmissionReview's ``response``."""
    import urllib.request

    request = urllib.request.Request(f"{url}/mutate", data=review, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=timeout) as answer:
        response: dict[str, Any] = json.load(answer)["response"]
    return response


def assert_pytorch_worker_1_wired(response: dict[str, Any]) -> None:
    """``response`` is the answer for examples/admission/pytorch-pod.json: allowed, with pytorch's variables."""
    assert response["allowed"] is True
    patch = json.loads(base64.b64decode(response["patch"]))
    env = next(op["value"] for op in patch if op["path"] == "/spec/containers/0/env")
    assert {"name": "MASTER_ADDR", "value": "pytorch-demo-master-0.pytorch-demo"} in env
    assert {"name": "RANK", "value": "2"} in env


@contextmanager
def in_thread(server: HTTPSServer) -> Iterator[HTTPSServer]:
    """``server`` serving in a daemon thread, its ephemeral port as ``server.port``; when the block
    ends it is told to exit and must have stopped within 10 s (and started within 10 s)."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool:
        assert server.started or thread.is_alive(), "server did not start: its thread ended"
        return bool(server.started)

    wait_until(started, 10, "the server to start", interval=0.01)
    server.port = server.addresses[0][1]  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive()


def files(certs: Path) -> CertReloader:
    """A reloader of ``certs``' tls.crt and tls.key, as serve makes for a certs directory."""
    return CertReloader.from_files(certs / "tls.crt", certs / "tls.key")


@contextmanager
def guarded_webhook(certs: Path, limits: ConnectionLimits, max_body_bytes: int) -> Iterator[tuple[HTTPSServer, ConnectionGuard]]:
    """The real webhook app over the example jobs, served over HTTPS on 127.0.0.1 with ``limits``
    (serve's guarded listener and protocol), in a thread; ``certs`` holds tls.crt and tls.key."""
    app = create_app(DirectoryJobSource(EXAMPLES / "jobs"), Chain(), max_body_bytes=max_body_bytes)
    server = build_server(app, "127.0.0.1", 0, files(certs), log_level="warning", limits=limits)
    with in_thread(server):
        yield server, server.guard


# Raw TLS clients: exactly the bytes a test sends, and whatever comes back ---------------------------


def tls(port: int) -> ssl.SSLSocket:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    return context.wrap_socket(raw, server_hostname="localhost")


def read_all(sock: ssl.SSLSocket, timeout: float = 5.0) -> bytes:
    """Everything the server sends until it closes the connection; TimeoutError when it has not
    closed it within ``timeout`` seconds."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, ssl.SSLError):
        pass
    return data


def read_response(sock: ssl.SSLSocket, timeout: float = 5.0) -> bytes:
    """One whole response on a kept-alive connection (headers, then content-length bytes)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else 0


def post(path: str, body: bytes, *, length: int | None = None, extra: bytes = b"") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body) if length is None else length}\r\n").encode() + extra + b"\r\n" + body


class TcpProxy:
    """A TCP forwarder on 127.0.0.1 to ``target`` that can be cut and mended: a network partition
    between one client (pointed at :attr:`port`) and a server everybody else still reaches. While
    cut, open connections are closed and new ones are closed as soon as they are accepted."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopping = False
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for sock in list(self._open):
                _close(sock)
            self._open.clear()

    def mend(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._stopping = True
        self.cut()
        _close(self._listener)

    def _accept(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            if self._cut.is_set():
                _close(conn)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(conn)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open.update((conn, upstream))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                _close(sock)
                with self._lock:
                    self._open.discard(sock)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
