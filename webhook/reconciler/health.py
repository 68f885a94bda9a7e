"""A small plain-HTTP server for the reconciler's probes and metrics (``/healthz``, ``/readyz``,
``/metrics``). It serves no admission traffic, so it needs no TLS; the webhook's own endpoints are
on its HTTPS port."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class HealthServer:
    def __init__(self, host: str, port: int, ready: Callable[[], bool], registry: CollectorRegistry,
                 details: Callable[[], dict[str, object]] = dict) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/healthz":
                    outer._send(self, 200, "application/json", json.dumps({"status": "ok"}).encode())
                elif self.path == "/readyz":
                    ok = ready()
                    body = {"status": "ready" if ok else "not ready", **details()}
                    outer._send(self, 200 if ok else 503, "application/json", json.dumps(body).encode())
                elif self.path == "/metrics":
                    outer._send(self, 200, CONTENT_TYPE_LATEST, generate_latest(registry))
                else:
                    outer._send(self, 404, "application/json", b'{"error": "not found"}')

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the logs

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="health", daemon=True)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, content_type: str, body: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
