"""The slow-client defence: bounds on what one HTTP client can hold of the webhook — its TLS
handshake, time for its headers and for each body, header bytes, open connections, and
request-body bytes buffered across all connections — counted in one :class:`ConnectionGuard` per
server.

The webhook is one shared service with ``failurePolicy: Fail``, reachable from every Pod in the
cluster, and uvicorn alone never times out a request whose headers or body arrive slowly, buffers as
many bodies as clients open, and starts a TLS handshake for every connection the kernel hands it
(its ``limit_concurrency`` answers 503 only once a handshake and headers are done;
``h11_max_incomplete_event_size`` is for h11, the slower parser, and answers 400). The rules:

* at most ``max_connections`` connections, TLS handshakes under way and closing connections
  included: a new one drops the one that has waited longest without a complete request (idle, or
  still sending headers or body); a request being answered is never cut, and when every connection
  is busy the new socket is closed before a single byte of TLS;
* at most ``max_handshakes`` TLS handshakes at a time, each within ``handshake_timeout``; until one
  ends the next socket waits (and those behind it wait in the kernel's backlog, costing nothing),
  and a handshake still under way after ``STALE_HANDSHAKE`` seconds is dropped for it, so clients
  that never say hello cannot hold the door shut. Why so few: the event loop runs every handshake
  whose bytes have arrived in one go, about 0.6 ms of CPU each here; profiled under 600 new
  connections a second, it stalled up to a second with 128 allowed, about 10 ms with 16;
* headers complete within ``header_timeout`` of the connection opening or of the first byte after
  an idle keep-alive (408), and within ``max_header_bytes`` (431);
* a request body complete within ``body_timeout`` of its headers (408);
* at most ``max_buffered_body_bytes`` of request bodies held across connections, from the first
  byte until the answer is sent: past it the incomplete bodies that started longest ago are
  dropped, the request that overflows last of all. A slow sender is always among the oldest, so
  requests that arrive whole (the API server's) keep being answered while slow ones are shed.

Timeouts are answered (408, 431) before the connection is closed; evicted and shed connections are
dropped without a word (a TCP reset): they are dropped to free memory now, not after a TLS goodbye
the client may never send. Idle keep-alive connections close after uvicorn's own
``timeout_keep_alive``. Memory freed when clients go away is handed back to the OS by
:class:`~.memory.MemoryTrimmer`.

Below uvicorn's public API — here only, pinned in pyproject.toml, each checked by name in
tests/test_connections.py: :class:`GuardedHttpToolsProtocol` extends ``HttpToolsProtocol``'s parser
callbacks (where a request's headers and body begin and end, which no public hook reports), and
:func:`accepting` answers the ``loop.create_server(factory, sock=...)`` with which
``uvicorn.Server.serve(sockets=...)`` opens the sockets it is given (the one point before TLS).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

_REASONS = {408: "Request Timeout", 431: "Request Header Fields Too Large"}
# accept() failing for lack of file descriptors or memory: wait a moment rather than spin.
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# A TLS handshake takes two round trips; one still going after this long may be dropped for another.
STALE_HANDSHAKE = 0.25


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server allows its clients (``serve``'s settings of the same names)."""

    header_timeout: float = 10.0
    body_timeout: float = 10.0
    idle_timeout: float = 30.0
    handshake_timeout: float = 10.0
    shutdown_timeout: float = 2.0  # TLS close_notify; a closing connection counts until it is gone
    max_connections: int = 1024
    max_handshakes: int = 16  # TLS handshakes under way at once
    max_header_bytes: int = 32 * 1024
    max_buffered_body_bytes: int = 32 * 1024 * 1024
    # SO_RCVBUF of the listening sockets, which accepted ones inherit (Linux doubles it): the TLS
    # layer reads what the kernel holds into a 256 KiB buffer and keeps the pages it touched for the
    # connection's life; measured, 2,000 connections sending 250 KB each held 255 MB with the
    # default buffer, 173 MB with 16 KiB.
    receive_buffer_bytes: int = 16 * 1024


class ConnectionGuard:
    """The state the connections of one server share: open connections, the order in which the
    waiting ones started waiting, handshakes under way, body bytes held, and counts of connections
    closed and why. ``protocol`` is the HTTP protocol class for ``uvicorn.Config(http=...)``."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.protocol: type[GuardedHttpToolsProtocol] = type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"guard": self})
        self.open: set[GuardedHttpToolsProtocol] = set()
        # Connections without a complete request (idle, or receiving one), longest waiting first;
        # the candidates for eviction. A connection whose request is being answered is not here.
        self.waiting: OrderedDict[GuardedHttpToolsProtocol, None] = OrderedDict()
        # Those of them holding part of a body, in the order they started to: shed first.
        self.holding: OrderedDict[GuardedHttpToolsProtocol, None] = OrderedDict()
        self.buffered = 0
        self.closed: Counter[str] = Counter()
        self.released = 0  # body bytes given back since the memory trimmer last looked
        self.peak_open = 0
        self.gone = 0  # connections ended (handshakes included), for the memory trimmer
        # Accepted sockets still in their TLS handshake, oldest first.
        self.handshakes: OrderedDict[asyncio.Task[Any], float] = OrderedDict()  # task -> loop.time() started

    def __len__(self) -> int:
        return len(self.open)

    def total(self) -> int:
        """Connections counted against ``max_connections``: open ones and those in a handshake."""
        return len(self.open) + len(self.handshakes)

    def make_room(self) -> bool:
        """Room for one more connection: True when there is, or when the connection that has waited
        longest was dropped for it; False when every connection is busy answering."""
        if self.total() < self.limits.max_connections:
            return True
        victim = next(iter(self.waiting), None)
        if victim is None:
            self.closed["refused"] += 1
            return False
        victim.abort(0, "evicted", "too many connections")
        return True

    def admit(self, conn: GuardedHttpToolsProtocol) -> bool:
        """Count ``conn``, whose handshake is done. Room was made when it was accepted; a
        connection that arrived some other way gets the same rule here."""
        if len(self.open) >= self.limits.max_connections and not self.make_room():
            return False
        self.open.add(conn)
        self.waiting[conn] = None
        self.peak_open = max(self.peak_open, len(self.open))
        return True

    def wait(self, conn: GuardedHttpToolsProtocol) -> None:
        """``conn`` starts waiting (for a request, or for the rest of one): it goes to the back."""
        if conn in self.open:
            self.waiting[conn] = None
            self.waiting.move_to_end(conn)

    def busy(self, conn: GuardedHttpToolsProtocol) -> None:
        self.waiting.pop(conn, None)
        self.holding.pop(conn, None)

    def closing(self, conn: GuardedHttpToolsProtocol) -> None:
        """``conn`` is being closed: no longer a candidate for anything, but still counted among
        the open connections until it is gone (a TLS close can take ``shutdown_timeout``, and
        its buffers live until then)."""
        self.waiting.pop(conn, None)
        self.holding.pop(conn, None)

    def forget(self, conn: GuardedHttpToolsProtocol) -> None:
        self.open.discard(conn)
        self.closing(conn)
        self.gone += 1

    def hold(self, conn: GuardedHttpToolsProtocol, size: int) -> None:
        """``conn`` buffered ``size`` more body bytes; shed the longest-holding incomplete bodies
        (``conn``'s last of all) past the limit. Constant time per call, whatever the crowd."""
        self.buffered += size
        if conn in self.waiting and conn not in self.holding:
            self.holding[conn] = None
        limit = self.limits.max_buffered_body_bytes
        while self.buffered > limit:
            victim = next((other for other in self.holding if other is not conn), None)
            if victim is None:
                conn.abort(0, "shed", "too many request bodies in flight")
                return
            victim.abort(0, "shed", "too many request bodies in flight")

    def release(self, conn: GuardedHttpToolsProtocol, size: int) -> None:
        self.buffered -= size
        self.released += size
        self.holding.pop(conn, None)


# The HTTP protocol ------------------------------------------------------------------------------------


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under the rules of its class's :class:`ConnectionGuard`
    (``guard.protocol``; uvicorn makes protocols itself, so the guard is the class's)."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held = 0  # body bytes of the current request, counted in guard.buffered
        self.admitted = False
        self.reading_headers = True
        self.header_bytes = 0
        self.message_started = False
        self.deadline: asyncio.TimerHandle | None = None
        self.deadline_reason = ""

    # Connection lifecycle (asyncio's protocol interface) ------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.guard.admit(self):
            self.transport.abort()  # nothing was asked: no answer, no TLS goodbye to wait for
            return
        self.admitted = True
        self._arm(self.guard.limits.header_timeout, "header-timeout", "request headers not received in time")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._release()
        self.guard.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self.reading_headers:
            if self.deadline_reason != "header-timeout":  # first byte after an idle keep-alive
                self._arm(self.guard.limits.header_timeout, "header-timeout", "request headers not received in time")
            self.header_bytes += len(data)
        super().data_received(data)
        if self.reading_headers and self.header_bytes > self.guard.limits.max_header_bytes:
            self.message_started = True
            self.abort(431, "header-too-large", f"request headers over {self.guard.limits.max_header_bytes} bytes")

    def abort(self, status: int, reason: str, message: str) -> None:
        """Close the connection for ``reason``. With a ``status``, answer it first when a request
        has begun and nothing was answered yet, then close (TLS's goodbye, bounded by the server's
        shutdown timeout); without one (``status=0``), drop the connection at once, freeing its
        buffers now. The application, if it is reading the body, sees the client disconnect."""
        if self.transport is None or self.transport.is_closing():
            self._disarm()  # closing already: only stop counting its body
            self._release()
            self.guard.closing(self)
            return
        self.guard.closed[reason] += 1
        self._disarm()
        cycle = self.cycle
        # While headers are read, ``cycle`` is the previous request's: write only once it is done.
        # While a body is read, it is this request's: write only if nothing was answered (a 413
        # may have been sent before the body ended).
        if self.reading_headers:
            writable = cycle is None or cycle.response_complete
        else:
            writable = not cycle.response_started
        answer = bool(status) and self.message_started and writable
        if answer:
            body = orjson.dumps({"error": message})
            head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
            self.transport.write(head + body)
        if cycle is not None and not cycle.response_complete:
            # uvicorn would tell the application only when the connection is lost, after a TLS
            # close that can take shutdown_timeout; told now, it lets go of the body it holds.
            cycle.disconnected = True
            cycle.message_event.set()
        self._release()
        self.guard.closing(self)
        if answer:
            self.transport.close()
        else:
            self.transport.abort()

    # uvicorn's parser callbacks -------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.message_started = True

    def on_headers_complete(self) -> None:
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.guard.limits.max_header_bytes:
            self.abort(431, "header-too-large", f"request headers over {self.guard.limits.max_header_bytes} bytes")
            return
        self.reading_headers = False
        self._arm(self.guard.limits.body_timeout, "body-timeout", "request body not received in time")
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self.transport.is_closing():
            return
        buffered = not self.cycle.response_complete
        super().on_body(body)
        if buffered:
            self.held += len(body)
            self.guard.hold(self, len(body))

    def on_message_complete(self) -> None:
        if self.transport.is_closing():
            return
        self._disarm()
        self.reading_headers, self.header_bytes, self.message_started = True, 0, False
        if self.cycle.response_complete:
            # Answered before its body ended (413): uvicorn's keep-alive timer was stopped by the
            # body's bytes and is not started again, so the connection is idle from now on.
            self.guard.wait(self)
            self._arm(self.guard.limits.idle_timeout, "idle-timeout", "idle")
        else:
            self.guard.busy(self)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._release()
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline and (self.cycle is None or self.cycle.response_complete):
            self.guard.wait(self)

    # Helpers -------------------------------------------------------------------------------------

    def _arm(self, seconds: float, reason: str, message: str) -> None:
        self._disarm()
        self.deadline = asyncio.get_running_loop().call_later(seconds, self.abort, 408, reason, message)
        self.deadline_reason = reason

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline, self.deadline_reason = None, ""

    def _release(self) -> None:
        if self.held:
            self.guard.release(self, self.held)
            self.held = 0


# Accepting connections, before any TLS work is spent on them -------------------------------------


class _AfterHandshake(asyncio.Protocol):
    """A connection's protocol while its TLS handshake runs: the HTTP protocol is made only once the
    handshake is done. uvicorn's protocol and its parser refer to each other, a cycle that is
    broken when the connection is lost; a handshake that never ends never gets there (measured:
    1,300 protocols kept alive after a flood, until a full garbage collection)."""

    def __init__(self, factory: Callable[[], asyncio.Protocol]) -> None:
        self.factory = factory

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        protocol = self.factory()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)


class GuardedListener:
    """Accepts on ``sock`` under ``guard``'s rules and runs the TLS handshakes (``context``) itself;
    what uvicorn asks of a listener: ``close()``, ``wait_closed()`` (and ``sockets``)."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol], sock: socket.socket,
                 context: ssl.SSLContext) -> None:
        self.guard = guard
        self.factory = factory
        self.sockets = [sock]
        self.context = context
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._slot_freed = asyncio.Event()
        self._accepting = self._loop.create_task(self._accept(sock), name="accept")

    async def _slot(self) -> None:
        """Wait until fewer than ``max_handshakes`` handshakes are under way, dropping the oldest
        once it has gone on for ``STALE_HANDSHAKE`` seconds (someone is waiting for its place)."""
        guard, loop = self.guard, self._loop
        while len(guard.handshakes) >= guard.limits.max_handshakes:
            oldest, started = next(iter(guard.handshakes.items()))
            age = loop.time() - started
            if age >= STALE_HANDSHAKE and not oldest.done() and not oldest.cancelling():
                guard.closed["handshake-dropped"] += 1
                oldest.cancel()
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), max(0.005, STALE_HANDSHAKE - age))

    async def _accept(self, listener: socket.socket) -> None:
        guard, loop = self.guard, self._loop
        while True:
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    log.warning("cannot accept connections (%s); retrying in 0.1 s", exc.strerror)
                    await asyncio.sleep(0.1)
                continue
            if not guard.make_room():
                conn.close()
                continue
            try:
                await self._slot()  # meanwhile this socket (no TLS yet) is the only one waiting
            except asyncio.CancelledError:
                conn.close()
                raise
            conn.setblocking(False)
            task = loop.create_task(self._handshake(conn))
            guard.handshakes[task] = loop.time()
            task.add_done_callback(self._handshake_done)

    async def _handshake(self, conn: socket.socket) -> None:
        limits = self.guard.limits
        try:
            await self._loop.connect_accepted_socket(lambda: _AfterHandshake(self.factory), conn, ssl=self.context,
                                                     ssl_handshake_timeout=limits.handshake_timeout,
                                                     ssl_shutdown_timeout=limits.shutdown_timeout)
        except (TimeoutError, OSError, ssl.SSLError, asyncio.CancelledError):
            conn.close()  # the transport, if any, was closed by the loop already

    def _handshake_done(self, task: asyncio.Task[Any]) -> None:
        self.guard.handshakes.pop(task, None)
        self.guard.gone += 1
        self._slot_freed.set()
        if not task.cancelled() and task.exception() is not None:
            log.warning("TLS connection setup failed: %r", task.exception())

    def close(self) -> None:
        self._accepting.cancel()
        for task in list(self.guard.handshakes):
            task.cancel()
        for sock in self.sockets:
            sock.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(self._accepting, return_exceptions=True)


@contextlib.contextmanager
def accepting(guard: ConnectionGuard, sockets: Collection[socket.socket], context: ssl.SSLContext) -> Iterator[None]:
    """While the block runs (on the event loop): when uvicorn opens one of ``sockets`` with the
    running loop's ``create_server(factory, sock=...)``, a :class:`GuardedListener` with ``context``
    takes it instead; any other call goes to the loop's own."""
    loop = asyncio.get_running_loop()
    own = loop.create_server

    async def create_server(factory: Callable[[], asyncio.Protocol], *args: Any, sock: socket.socket | None = None,
                            **kwargs: Any) -> Any:
        if sock is not None and sock in sockets:
            return GuardedListener(guard, factory, sock, context)
        return await own(factory, *args, sock=sock, **kwargs)

    loop.create_server = create_server  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        del loop.create_server  # the instance attribute: the loop's own method again


# What the guard did ---------------------------------------------------------------------------------


class GuardCollector:
    """Prometheus view of a guard: open connections, body bytes held, connections closed by reason."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self.guard = guard

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        yield GaugeMetricFamily("volcano_webhook_connections_open", "Open client connections", value=len(self.guard))
        yield GaugeMetricFamily("volcano_webhook_tls_handshakes", "TLS handshakes under way", value=len(self.guard.handshakes))
        yield GaugeMetricFamily("volcano_webhook_buffered_body_bytes", "Request-body bytes held", value=self.guard.buffered)
        closed = CounterMetricFamily("volcano_webhook_connections_closed", "Connections closed by the webhook's limits",
                                     labels=["reason"])
        for reason in ("header-timeout", "body-timeout", "idle-timeout", "header-too-large", "evicted", "shed", "refused",
                       "handshake-dropped"):
            closed.add_metric([reason], self.guard.closed[reason])
        yield closed


def log_closed(guard: ConnectionGuard, seen: Counter[str]) -> None:
    """One warning line for the connections closed since ``seen`` (updated): never one line per
    connection, which a flood would turn into a second attack on the logs."""
    fresh = guard.closed - seen
    if fresh:
        summary = ", ".join(f"{reason} {count}" for reason, count in sorted(fresh.items()))
        log.warning("closed client connections at the webhook's limits: %s (open now: %d)", summary, len(guard))
        seen.update(fresh)
