"""Run a real HTTPS server of the product in a thread, for tests that talk to it over sockets."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from volcano_job_webhook.certs.tls import HTTPSServer


@contextmanager
def in_thread(server: HTTPSServer) -> Iterator[HTTPSServer]:
    """``server`` serving in a daemon thread, its ephemeral port as ``server.port``; when the block
    ends it is told to exit and must have stopped within 10 s (and started within 10 s)."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.01)
    server.port = server.addresses[0][1]  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive()
