"""How soon the HTTPS server cuts a client that holds a connection, measured against the limit it
enforces: headers that never end, a connection that never sends a byte, a TLS handshake that never
starts, a body that stops or never ends, a body trickled a byte at a time, a kept-alive connection
left idle, and the rest of a body the server already answered (413). The real app and server with
serve's guarded listener and protocol, in this process, every timeout at ``--limit`` seconds; each
case ``--rounds`` times. tests/double/test_connections.py asserts that each cut happens and why; this says
when.

Target: every cut between its limit (minus 0.1 s, the timer's start being a little before the
client's last byte) and the limit plus 0.5 s.

    python bench/timeouts.py [--rounds N] [--limit SECONDS]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from tests.helpers.servers import guarded_webhook, post, read_all, read_response, tls  # noqa: E402
from volcano_job_webhook.certs import ensure_certs  # noqa: E402
from volcano_job_webhook.server.connections import ConnectionLimits  # noqa: E402

MAX_BODY = 100_000
REVIEW = (ROOT / "examples" / "admission" / "pytorch-pod.json").read_bytes()
EARLY, LATE = 0.1, 0.5


def time_to_cut(port: int, request: bytes, *, answered: bool = False, then: bytes = b"") -> float:
    """Seconds from the client's last byte to the server's close: ``request`` sent, and when
    ``answered``, its response read and ``then`` sent."""
    with tls(port) as sock:
        sock.sendall(request)
        if answered:
            read_response(sock)
            sock.sendall(then)
        started = time.monotonic()
        read_all(sock, timeout=30)
    return time.monotonic() - started


def silent_handshake(port: int) -> float:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        started = time.monotonic()
        raw.recv(1024)
    return time.monotonic() - started


def trickled_body(port: int) -> float:
    """From the end of the headers: a byte every 100 ms resets no timer."""
    with tls(port) as sock:
        sock.sendall(post("/mutate", b"", length=1000))
        started = time.monotonic()
        sock.settimeout(0.1)
        while time.monotonic() - started < 30:
            try:
                sock.sendall(b" ")
                if sock.recv(4096):
                    break
            except TimeoutError:
                continue
            except OSError:
                break
    return time.monotonic() - started


CASES: dict[str, Callable[[int], float]] = {
    "headers that never end (header timeout)": lambda port: time_to_cut(port, b"POST /mutate HTTP/1.1\r\nhost: localhost\r\n"),
    "no byte at all after the handshake (header timeout)": lambda port: time_to_cut(port, b""),
    "no TLS ClientHello (handshake timeout)": silent_handshake,
    "a body that stops (body timeout)": lambda port: time_to_cut(port, post("/mutate", b'{"apiVersion"', length=5000)),
    "a chunked body that never ends (body timeout)": lambda port: time_to_cut(
        port, b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n"),
    "a body trickled a byte every 100 ms (body timeout)": trickled_body,
    "a kept-alive connection left idle (idle timeout)": lambda port: time_to_cut(port, post("/mutate", REVIEW), answered=True),
    "the rest of a body answered 413, then silence (body timeout)": lambda port: time_to_cut(
        port, post("/mutate", b" " * 1000, length=MAX_BODY + 1), answered=True, then=b" " * 1000),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--limit", type=float, default=1.0, help="every timeout, in seconds")
    options = parser.parse_args()
    limit = options.limit
    limits = ConnectionLimits(header_timeout_seconds=limit, body_timeout_seconds=limit, idle_timeout_seconds=limit,
                              tls_handshake_timeout_seconds=limit, max_connections=50)
    print(f"every timeout {limit:g} s; target: cut {limit - EARLY:g} to {limit + LATE:g} s after the client's last byte\n")
    print("| client | median | max | target | |\n|---|---|---|---|---|")
    missed = 0
    with tempfile.TemporaryDirectory() as certs:
        ensure_certs(Path(certs))
        with guarded_webhook(Path(certs), limits, MAX_BODY) as (server, _):
            port = server.port  # type: ignore[attr-defined]
            for name, case in CASES.items():
                took = [case(port) for _ in range(options.rounds)]
                met = limit - EARLY <= min(took) and max(took) <= limit + LATE
                missed += not met
                print(f"| {name} | {statistics.median(took):.2f} s | {max(took):.2f} s | "
                      f"{limit - EARLY:g}–{limit + LATE:g} s | {'met' if met else 'MISSED'} |")
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
