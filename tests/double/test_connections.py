"""What one client can hold, against the real uvicorn HTTPS server on loopback with small limits:
slow headers, slow and unfinished bodies, idle keep-alive, silent TLS handshakes and the
connection cap — and that normal requests keep being answered meanwhile.

Each cut is asserted by what the client gets (a 408, the connection closed) and the guard's count of
why; a reading socket gives up after 5 s, so a server that never cuts fails the test rather than
hang it. How soon after its limit each cut comes is bench/timeouts.py's to measure.

The last section checks, each by name, the parts of uvicorn below its public API that
webhook/server/connections.py stands on, so that a uvicorn release which moves one fails there
instead of leaving a server that starts and quietly stops applying a limit."""

from __future__ import annotations

import ast
import gc
import inspect
import json
import signal
import socket
import ssl
import threading
import time
import weakref
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path

import pytest
import uvicorn
import uvicorn.server
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tests.helpers.envtest import wait_until
from tests.helpers.paths import EXAMPLES
from tests.helpers.servers import files, guarded_webhook, post, read_all, read_response, status_of, tls
from volcano_job_webhook.certs import ensure_certs
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.server.app import create_app
from volcano_job_webhook.server.connections import ConnectionGuard, ConnectionLimits, GuardedHttpToolsProtocol, GuardedListener
from volcano_job_webhook.server.https import HTTPSServer, build_server
from volcano_job_webhook.server.jobs import DirectoryJobSource

LIMITS = ConnectionLimits(
    header_timeout_seconds=0.6, body_timeout_seconds=0.6, idle_timeout_seconds=0.6, tls_handshake_timeout_seconds=0.6,
    max_connections=50,
)
MAX_BODY = 100_000
REVIEW = (EXAMPLES / "admission" / "pytorch-pod.json").read_bytes()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("certs")
    ensure_certs(path)
    return path


def serving(certs: Path, limits: ConnectionLimits = LIMITS) -> AbstractContextManager[tuple[HTTPSServer, ConnectionGuard]]:
    return guarded_webhook(certs, limits, MAX_BODY)


def mutate_ok(port: int) -> bool:
    """One normal /mutate on a fresh connection: answered 200 with a patch."""
    with tls(port) as sock:
        sock.sendall(post("/mutate", REVIEW, extra=b"connection: close\r\n"))
        reply = read_all(sock)
    return status_of(reply) == 200 and b'"patchType":"JSONPatch"' in reply


def test_slow_headers_get_408_and_are_closed(certs):
    with serving(certs) as (server, guard):
        with tls(server.port) as sock:
            sock.sendall(b"POST /mutate HTTP/1.1\r\nhost: localhost\r\n")  # and never the rest
            reply = read_all(sock)
        assert status_of(reply) == 408 and b"request headers not received in time" in reply
        assert guard.closed["header-timeout"] == 1
        assert mutate_ok(server.port)


def test_a_connection_that_never_sends_a_byte_is_closed(certs):
    with serving(certs) as (server, guard):
        with tls(server.port) as sock:
            reply = read_all(sock)
        assert reply == b""  # nothing was asked, so nothing is answered
        assert guard.closed["header-timeout"] == 1


def test_a_silent_tls_handshake_is_cut(certs):
    with serving(certs) as (server, _), socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
        assert raw.recv(1024) == b""  # the server hangs up without a ClientHello


@pytest.mark.parametrize("kind", ["content-length", "chunked"])
def test_slow_or_unfinished_bodies_get_408_and_are_closed(certs, kind):
    with serving(certs) as (server, guard):
        with tls(server.port) as sock:
            if kind == "chunked":
                sock.sendall(b"POST /mutate HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n")
            else:
                sock.sendall(post("/mutate", b'{"apiVersion"', length=5000))
            reply = read_all(sock)
        assert status_of(reply) == 408 and b"request body not received in time" in reply
        assert guard.closed["body-timeout"] == 1
        assert mutate_ok(server.port)


def test_a_body_trickled_byte_by_byte_is_cut_at_the_body_timeout(certs):
    with serving(certs) as (server, guard):
        with tls(server.port) as sock:
            sock.sendall(post("/mutate", b"", length=1000))
            started = time.monotonic()
            sock.settimeout(0.1)
            reply = b""
            while time.monotonic() - started < 5:  # a byte every 100 ms, never idle and never done, for at most 5 s
                try:
                    sock.sendall(b" ")
                    reply += sock.recv(4096)
                    if reply:
                        break
                except TimeoutError:
                    continue
                except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
                    break
        assert status_of(reply) == 408, "cut at the body timeout, though a byte came every 100 ms"
        assert guard.closed["body-timeout"] == 1


def test_headers_that_never_end_on_a_kept_alive_connection_get_408(certs):
    """The header deadline starts again at the first byte of the next request on a kept-alive
    connection: that byte stops uvicorn's keep-alive timer, and nothing else would cut the rest."""
    with serving(certs, replace(LIMITS, idle_timeout_seconds=30)) as (server, guard), tls(server.port) as sock:
        sock.sendall(post("/mutate", REVIEW))
        assert status_of(read_response(sock)) == 200
        sock.sendall(b"POST /mutate HTTP/1.1\r\nhost: localhost\r\n")  # and never the rest
        reply = read_all(sock)
        assert status_of(reply) == 408 and +guard.closed == {"header-timeout": 1}


def test_idle_keep_alive_connections_are_closed(certs):
    with serving(certs) as (server, _), tls(server.port) as sock:
        sock.sendall(post("/mutate", REVIEW))
        assert status_of(read_response(sock)) == 200
        assert read_all(sock) == b""  # uvicorn's keep-alive timer, set to the idle timeout


def test_a_client_within_its_limits_is_served(certs):
    """The other side of the cuts above: headers and a body that come in pieces, and a second request
    on a connection kept alive, each pause a quarter of its limit, are answered and nothing is cut."""
    pause = min(LIMITS.header_timeout_seconds, LIMITS.body_timeout_seconds, LIMITS.idle_timeout_seconds) / 4
    head, _, body = post("/mutate", REVIEW).partition(b"\r\n\r\n")
    with serving(certs) as (server, guard), tls(server.port) as sock:
        for piece in (head[:20], head[20:] + b"\r\n\r\n" + body[:100]):
            sock.sendall(piece)
            time.sleep(pause)
        sock.sendall(body[100:])
        assert status_of(read_response(sock)) == 200
        time.sleep(pause)
        sock.sendall(post("/mutate", REVIEW))
        assert status_of(read_response(sock)) == 200
        assert +guard.closed == {}


def test_a_request_answered_early_does_not_leave_its_connection_open(certs):
    """413 on the declared length is sent before the body: the rest of it, and then silence, must
    not keep the connection open forever (uvicorn stops its keep-alive timer on every byte)."""
    with serving(certs) as (server, guard), tls(server.port) as sock:
        sock.sendall(post("/mutate", b" " * 1000, length=MAX_BODY + 1))
        assert status_of(read_response(sock)) == 413
        sock.sendall(b" " * 1000)
        read_all(sock)  # TimeoutError unless the server closes it
        assert +guard.closed == {"body-timeout": 1}, "the body never ends: its timer runs on after the answer"


def test_the_connection_cap_closes_the_longest_waiting_connection(certs):
    limits = replace(LIMITS, max_connections=3, header_timeout_seconds=30, idle_timeout_seconds=30)
    with serving(certs, limits) as (server, guard):
        idle = [tls(server.port) for _ in range(3)]
        wait_until(lambda: len(guard) == 3, 5.0, "three connections held", interval=0.01)
        assert mutate_ok(server.port), "a new connection is served: the oldest idle one made room"
        assert read_all(idle[0], timeout=2) == b"", "the oldest was closed"
        assert guard.closed["evicted"] >= 1 and len(guard) <= 3
        for sock in idle:
            sock.close()


def test_413_is_kept_for_a_declared_or_streamed_oversized_body(certs):
    with serving(certs) as (server, _):
        with tls(server.port) as sock:
            sock.sendall(post("/mutate", b"", length=MAX_BODY + 1, extra=b"connection: close\r\n"))
            assert status_of(read_all(sock)) == 413
        with tls(server.port) as sock:
            chunk = b"%x\r\n%s\r\n" % (MAX_BODY + 1, b" " * (MAX_BODY + 1))
            sock.sendall(b"POST /mutate HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n" + chunk)
            assert status_of(read_all(sock)) == 413


def test_slow_connections_leave_nothing_behind(certs):
    """After many slow clients go away the guard is back to zero and no protocol object (with its
    buffers) is kept alive by a reference."""
    with serving(certs, replace(LIMITS, header_timeout_seconds=30, body_timeout_seconds=30)) as (server, guard):
        socks = []
        for i in range(30):
            sock = tls(server.port)
            sock.sendall(post("/mutate", b" " * 5000, length=MAX_BODY) if i % 2 else b"POST /mutate HTTP/1.1\r\n")
            socks.append(sock)
        wait_until(lambda: len(guard.open) == 30 and sum(p.cycle is not None for p in guard.open) == 15, 5.0,
                   "30 open connections, 15 of them holding their bodies", interval=0.01)
        protocols = [weakref.ref(p) for p in list(guard.open)]
        for sock in socks:
            sock.close()
        wait_until(lambda: not len(guard), 5.0, "every connection gone", interval=0.01)
        assert not guard.waiting
        assert mutate_ok(server.port)
        time.sleep(0.2)
        gc.collect()
        assert not [ref for ref in protocols if ref() is not None]


def test_settings_reach_the_server(certs, monkeypatch):
    from volcano_job_webhook.config import load_settings
    from volcano_job_webhook.server.run import connection_limits

    monkeypatch.setenv("VOLCANO_WEBHOOK_HEADER_TIMEOUT_SECONDS", "0.5")
    monkeypatch.setenv("VOLCANO_WEBHOOK_MAX_CONNECTIONS", "7")
    limits = connection_limits(load_settings())
    assert (limits.header_timeout_seconds, limits.max_connections) == (0.5, 7)
    server = build_server(lambda scope, receive, send: None, "127.0.0.1", 0, files(certs), limits=limits)
    guard = server.guard
    assert guard.limits is limits
    assert server.config.http is guard.protocol and issubclass(guard.protocol, GuardedHttpToolsProtocol) and guard.protocol.guard is guard
    assert server.config.ws == "none" and server.config.timeout_keep_alive == limits.idle_timeout_seconds
    with pytest.raises(TypeError, match="timeout_keep_alive"):
        build_server(lambda scope, receive, send: None, "127.0.0.1", 0, files(certs), timeout_keep_alive=5)
    json.dumps(limits.__dict__)


def test_clients_that_never_say_hello_cannot_hold_the_door(certs):
    """Two handshakes at a time, both taken by TCP connections that send nothing: a real client
    still gets in, because a handshake stalled past STALE_HANDSHAKE is dropped for it."""
    limits = replace(LIMITS, max_tls_handshakes=2, tls_handshake_timeout_seconds=30)
    with serving(certs, limits) as (server, guard):
        silent = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(2)]
        wait_until(lambda: len(guard.handshakes) == 2, 5.0, "two handshakes under way", interval=0.01)
        assert mutate_ok(server.port)
        assert guard.closed["handshake-dropped"] >= 1
        for sock in silent:
            sock.close()


def test_the_listening_socket_keeps_a_small_receive_buffer(certs):
    with serving(certs, replace(LIMITS, receive_buffer_bytes=32 * 1024)) as (server, _):
        assert len(server.sockets) == 1 and server.addresses == [server.sockets[0].getsockname()]
        assert server.sockets[0].getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) in (32 * 1024, 64 * 1024)  # Linux doubles it


# uvicorn below its public API: what connections.py stands on ------------------------------------------


def changed(what: str, where: str) -> str:
    return f"uvicorn {uvicorn.__version__}: {what}. webhook/server/connections.py relies on it in {where}; adapt it there, then move the pin in pyproject.toml"


def stored_on_self(cls: type) -> set[str]:
    """``self.X`` that ``cls``'s own source assigns."""
    tree = ast.parse(inspect.getsource(cls))
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == "self"}


EXTENDED = ("connection_made", "connection_lost", "data_received", "on_message_begin", "on_headers_complete",
            "on_message_complete", "on_response_complete")


def test_the_protocol_methods_we_extend_keep_their_parameters():
    ours = sorted(name for name, value in vars(GuardedHttpToolsProtocol).items()
                  if callable(value) and not name.startswith("__") and hasattr(HttpToolsProtocol, name))
    assert ours == sorted(EXTENDED), "the list of extended methods above is out of date"
    for name in EXTENDED:
        theirs = getattr(HttpToolsProtocol, name)
        assert list(inspect.signature(theirs).parameters) == list(inspect.signature(getattr(GuardedHttpToolsProtocol, name)).parameters), \
            changed(f"HttpToolsProtocol.{name}{inspect.signature(theirs)}", f"GuardedHttpToolsProtocol.{name}, which calls super().{name}")
    clash = stored_on_self(GuardedHttpToolsProtocol) & stored_on_self(HttpToolsProtocol)
    assert not clash, changed(f"HttpToolsProtocol now uses the attributes {sorted(clash)}", "GuardedHttpToolsProtocol, which keeps its own state there")


def test_a_live_protocol_has_the_state_we_read_and_its_answer_calls_us_back(certs):
    """On a served connection: the protocol's ``transport``, ``pipeline`` and ``cycle``; the request
    cycle's ``response_started`` and ``response_complete``; and the answer calling
    ``on_response_complete``, which puts the connection back among the waiting (evictable) ones."""
    where = "GuardedHttpToolsProtocol.abort, on_headers_complete, on_message_complete, on_response_complete"
    with serving(certs) as (server, guard), tls(server.port) as sock:
        sock.sendall(post("/mutate", REVIEW))
        assert status_of(read_response(sock)) == 200
        protocol = wait_until(lambda: next(iter(guard.waiting), None), 5.0, changed(
            "the answered connection is not waiting again: on_response_complete was not called", where), interval=0.01)
        for name in ("transport", "pipeline", "cycle"):
            assert hasattr(protocol, name), changed(f"HttpToolsProtocol has no {name}", where)
        cycle = protocol.cycle
        for name in ("response_started", "response_complete"):
            assert getattr(cycle, name, None) is True, changed(f"the request cycle's {name} is not True once answered", where)


def test_serve_opens_the_sockets_it_is_given_with_the_running_loops_create_server(certs):
    """A TCP connection that says nothing is a handshake counted by our listener: uvicorn opened the
    socket through ``connections.accepting``, not on its own (where nothing would bound it)."""
    with serving(certs) as (server, guard), socket.create_connection(("127.0.0.1", server.port), timeout=5):
        wait_until(lambda: len(guard.handshakes) == 1, 5.0, changed(
            "Server.serve(sockets=...) no longer opens them with the running loop's create_server(factory, sock=...)", "accepting"),
            interval=0.01)


def test_uvicorn_asks_its_listeners_only_what_ours_has():
    module = ast.parse(inspect.getsource(uvicorn.server))
    used = {node.attr for node in ast.walk(module)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "server"}
    assert {"close", "wait_closed"} <= used, changed(f"uvicorn/server.py no longer closes its listeners with close()/wait_closed() ({sorted(used)})",
                                                     "GuardedListener")
    missing = sorted(used - set(dir(GuardedListener)) - stored_on_self(GuardedListener))
    assert not missing, changed(f"uvicorn now uses server.{', server.'.join(missing)} of a listener", "GuardedListener")


def draining(certs: Path, drain_seconds: float, limits: ConnectionLimits | None = None) -> tuple[HTTPSServer, threading.Thread]:
    """A server with a drain of ``drain_seconds``, started in a thread (SIGTERM is ``handle_exit``)."""
    app = create_app(DirectoryJobSource(EXAMPLES / "jobs"), Chain())
    server = build_server(app, "127.0.0.1", 0, files(certs), limits=limits, log_level="warning", drain_seconds=drain_seconds)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "the server to start", interval=0.01)
    return server, thread


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: webhook\r\n\r\n"


def test_after_sigterm_each_answer_closes_its_connection_until_the_server_stops(certs: Path) -> None:
    """The first SIGTERM drains: the server goes on answering, each answer with ``Connection: close``
    (so the API server stops reusing its connections to a leaving replica), and stops
    ``drain_seconds`` later when no connection is open."""
    server, thread = draining(certs, 1.0)
    port = server.addresses[0][1]
    with tls(port) as before:
        before.sendall(HEALTHZ)
        assert b"connection: close" not in read_response(before).lower()
    server.handle_exit(signal.SIGTERM, None)
    with tls(port) as during:
        during.sendall(HEALTHZ)
        reply = read_response(during)
        assert status_of(reply) == 200 and b"connection: close" in reply.lower()
    thread.join(5)
    assert not thread.is_alive(), "still serving 5 s after a drain of 1 s"


def test_after_the_drain_a_kept_alive_connection_is_left_to_its_client(certs: Path) -> None:
    """Past ``drain_seconds`` the server keeps an idle kept-alive connection open, and answers a
    request on it (with ``Connection: close``), stopping once it is gone: closing it would race the API
    server writing a Pod's review onto it (an EOF a POST is not retried on: a refused Pod)."""
    server, thread = draining(certs, 0.5)
    with tls(server.addresses[0][1]) as kept:
        kept.sendall(HEALTHZ)
        assert status_of(read_response(kept)) == 200
        server.handle_exit(signal.SIGTERM, None)
        time.sleep(1.5)
        assert thread.is_alive(), "stopped with a connection its client still keeps"
        kept.sendall(HEALTHZ)
        reply = read_all(kept)
        assert status_of(reply) == 200 and b"connection: close" in reply.lower()
    thread.join(5)
    assert not thread.is_alive(), "still serving 5 s after its last connection closed"


def test_a_drain_ends_at_the_idle_timeout_of_a_connection_never_used_again(certs: Path) -> None:
    """A client that neither uses nor closes its connection holds the drain no longer than the idle
    timeout, which closes it."""
    server, thread = draining(certs, 0.1, LIMITS)
    with tls(server.addresses[0][1]) as kept:
        kept.sendall(HEALTHZ)
        assert status_of(read_response(kept)) == 200
        server.handle_exit(signal.SIGTERM, None)
        assert read_all(kept, timeout=5.0) == b"", "the idle connection was not closed at its idle timeout"
    thread.join(5)
    assert not thread.is_alive(), "still serving 5 s after the idle timeout closed its last connection"
