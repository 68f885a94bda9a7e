"""The reconciler's plain-HTTP probe port (``/healthz``, ``/readyz``, ``/metrics``).
No TLS, as no admission traffic, but it listens on every address: as on the webhook's port, each
connection has a deadline (``header_timeout_seconds``) and only so many are served at once."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

CONNECTIONS = 32


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], deadline: float) -> None:
        super().__init__(address, handler)
        self.deadline = deadline
        self._slots = threading.BoundedSemaphore(CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if self._slots.acquire(blocking=False):
            super().process_request(request, client_address)
        else:
            self.shutdown_request(request)  # every slot held: this one is closed at once

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        # The whole connection within the deadline, however slowly its bytes come.
        timer = threading.Timer(self.deadline, _cut, (request,))
        timer.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            timer.cancel()
            self._slots.release()


def _cut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class HealthServer:
    def __init__(self, host: str, port: int, ready: Callable[[], bool], registry: CollectorRegistry,
                 details: Callable[[], dict[str, object]] = dict, timeout: float = 10.0) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    self.answer(200, "application/json", b'{"status": "ok"}')
                elif self.path == "/readyz":
                    ok = ready()
                    self.answer(200 if ok else 503, "application/json",
                                json.dumps({"status": "ready" if ok else "not ready", **details()}).encode())
                elif self.path == "/metrics":
                    self.answer(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                else:
                    self.answer(404, "application/json", b'{"error": "not found"}')

            def answer(self, status: int, content_type: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the logs

        Handler.timeout = timeout  # each read and write on the socket
        self.server = _Server((host, port), Handler, timeout)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
