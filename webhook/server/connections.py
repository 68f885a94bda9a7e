"""The slow-client defence, which uvicorn lacks: what one client may hold of the webhook, counted in
one :class:`ConnectionGuard` per server. Each piece names the measurement that fails without it:
bench/fuzz.py's slow attack run with that piece taken away (docs/benchmarks.md, Hardening), a row
of bench/timeouts.py, or a hostile case of tests/double/test_connections.py. Below uvicorn's public API
(pinned in pyproject.toml, checked by tests/double/test_connections.py): its protocol's parser callbacks,
and ``Server.serve(sockets=...)``'s ``loop.create_server`` call (:func:`accepting`)."""

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

from volcano_job_webhook.memory import trim

log = logging.getLogger(__name__)

# accept() failing for lack of file descriptors or memory: wait a moment rather than spin on the
# loop. No benchmark runs out of descriptors: kept by judgement, not by a measurement.
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# A TLS handshake takes two round trips; one still going after this long may be dropped for another
# (test_clients_that_never_say_hello_cannot_hold_the_door: else silent sockets that fill the
# handshake slots keep every real client out until the handshake timeout).
STALE_HANDSHAKE = 0.25


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server allows its clients (``serve``'s settings of the same names)."""

    # Each timeout: bench/timeouts.py's row of the same name, cut within 0.9-1.5 s of a 1 s limit
    # (uvicorn has no header or body timeout, asyncio's handshake timeout is 60 s).
    header_timeout_seconds: float = 10.0
    body_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 100.0  # past the API server's 90 s, so it closes first (https.py, on_tick)
    tls_handshake_timeout_seconds: float = 10.0
    shutdown_timeout: float = 2.0  # TLS close_notify; a closing connection counts until it is gone
    # bench/fuzz.py's slow attack (2,000 connections, more than this): RSS < 256 MB, and back within
    # 20 MB after (without a cap: a 384 MB peak, +20.1 MB after).
    max_connections: int = 1024
    # bench/fuzz.py's slow attack: /healthz p99 < 50 ms, /mutate < 20 ms while attackers reconnect, the
    # handshakes running on the loop (without a limit: 128 ms and 139 ms, and a probe failed).
    max_tls_handshakes: int = 16
    # bench/fuzz.py's slow attack: RSS < 256 MB; accepted sockets inherit SO_RCVBUF, and TLS keeps what
    # it read into (with the kernel's default: a 388 MB peak).
    receive_buffer_bytes: int = 16 * 1024


class ConnectionGuard:
    """What the connections of one server share, and counts of those closed and why; ``protocol``
    is the HTTP protocol class for ``uvicorn.Config(http=...)``."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.protocol: type[GuardedHttpToolsProtocol] = type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"guard": self})
        self.open: set[GuardedHttpToolsProtocol] = set()
        # Connections without a complete request (idle, or receiving one), longest waiting first: evicted first.
        self.waiting: OrderedDict[GuardedHttpToolsProtocol, None] = OrderedDict()
        self.closed: Counter[str] = Counter()
        self.gone = 0  # connections ended (handshakes included), for the memory trimmer
        # Accepted sockets still in their TLS handshake, oldest first: task -> loop.time() started.
        self.handshakes: OrderedDict[asyncio.Task[Any], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self.open)

    def make_room(self) -> bool:
        """Room for one more connection (open or in its handshake): True when there is, or when the
        one that has waited longest was dropped for it; False when every one is busy answering
        (test_the_connection_cap_closes_the_longest_waiting_connection: else idle clients at the cap
        keep the API server's new connections out)."""
        if len(self.open) + len(self.handshakes) < self.limits.max_connections:
            return True
        victim = next(iter(self.waiting), None)
        if victim is None:
            self.closed["refused"] += 1
            return False
        victim.abort(0, "evicted", "too many connections")
        return True

    def admit(self, conn: GuardedHttpToolsProtocol) -> None:
        """Count ``conn``, whose handshake is done (room was made when it was accepted)."""
        self.open.add(conn)
        self.waiting[conn] = None

    def wait(self, conn: GuardedHttpToolsProtocol) -> None:
        """``conn`` starts waiting (for a request, or for the rest of one): it goes to the back."""
        if conn in self.open:
            self.waiting[conn] = None
            self.waiting.move_to_end(conn)

    def withdraw(self, conn: GuardedHttpToolsProtocol) -> None:
        """``conn`` is answering, or closing (open until it is gone): no candidate for eviction."""
        self.waiting.pop(conn, None)

    def forget(self, conn: GuardedHttpToolsProtocol) -> None:
        self.open.discard(conn)
        self.withdraw(conn)
        self.gone += 1

    def collect(self) -> Iterator[Any]:
        """The guard as a Prometheus collector: open connections, handshakes under way, connections closed by reason."""
        yield GaugeMetricFamily("volcano_webhook_connections_open", "Open client connections", value=len(self))
        yield GaugeMetricFamily("volcano_webhook_tls_handshakes", "TLS handshakes under way", value=len(self.handshakes))
        closed = CounterMetricFamily("volcano_webhook_connections_closed", "Connections closed by the webhook's limits",
                                     labels=["reason"])
        for reason in ("header-timeout", "body-timeout", "idle-timeout", "evicted", "refused", "handshake-dropped"):
            closed.add_metric([reason], self.closed[reason])
        yield closed


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under the rules of its class's :class:`ConnectionGuard`
    (``guard.protocol``; uvicorn makes protocols itself, so the guard is the class's)."""

    guard: ConnectionGuard

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reading_headers = True
        self.message_started = False
        self.deadline: asyncio.TimerHandle | None = None
        self.timers: asyncio.AbstractEventLoop
        self.deadline_reason = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # Kept: get_running_loop() makes a getpid() system call, and every request arms two deadlines.
        self.timers = asyncio.get_running_loop()
        super().connection_made(transport)
        self.guard.admit(self)
        self._arm(self.guard.limits.header_timeout_seconds, "header-timeout", "request headers not received in time")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # The first byte after an idle keep-alive stops uvicorn's keep-alive timer: the header deadline
        # starts here (test_headers_that_never_end_on_a_kept_alive_connection_get_408).
        if self.reading_headers and self.deadline_reason != "header-timeout":
            self._arm(self.guard.limits.header_timeout_seconds, "header-timeout", "request headers not received in time")
        super().data_received(data)

    def abort(self, status: int, reason: str, message: str) -> None:
        """Close the connection for ``reason``: with a ``status`` (408), answered first if a request
        began and nothing was answered, then closed; with ``status=0``, dropped at once, its buffers
        freed now. The application sees the client disconnect once the transport is gone."""
        self._disarm()
        if self.transport is None or self.transport.is_closing():  # closing already
            self.guard.withdraw(self)
            return
        self.guard.closed[reason] += 1
        cycle = self.cycle
        # Reading headers, ``cycle`` is the previous request's: write once it is done. Reading a
        # body, it is this one's: write only if nothing was answered (a 413 may have gone already).
        writable = (cycle is None or cycle.response_complete) if self.reading_headers else not cycle.response_started
        answer = bool(status) and self.message_started and writable
        if answer:
            body = orjson.dumps({"error": message})
            self.transport.write(b"HTTP/1.1 %d Request Timeout\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                                 b"connection: close\r\n\r\n%s" % (status, len(body), body))
        self.guard.withdraw(self)
        if answer:
            self.transport.close()
        else:
            self.transport.abort()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.message_started = True

    def on_headers_complete(self) -> None:
        self.reading_headers = False
        self._arm(self.guard.limits.body_timeout_seconds, "body-timeout", "request body not received in time")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self.transport.is_closing():
            return
        self._disarm()
        self.reading_headers, self.message_started = True, False
        if self.cycle.response_complete:
            # Answered before its body ended (413): uvicorn's keep-alive timer was stopped by the
            # body's bytes and is not started again (bench/timeouts.py's 413 row).
            self.guard.wait(self)
            self._arm(self.guard.limits.idle_timeout_seconds, "idle-timeout", "idle")
        else:
            self.guard.withdraw(self)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline and (self.cycle is None or self.cycle.response_complete):
            self.guard.wait(self)

    def _arm(self, seconds: float, reason: str, message: str) -> None:
        self._disarm()
        self.deadline = self.timers.call_later(seconds, self.abort, 408, reason, message)
        self.deadline_reason = reason

    def _disarm(self) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline, self.deadline_reason = None, ""


class GuardedListener:
    """Accepts on ``sock`` under ``guard``'s rules and runs the TLS handshakes (``context``) itself, so
    that handshakes count under ``max_connections``, run ``max_tls_handshakes`` at a time and end at
    ``tls_handshake_timeout_seconds``; what uvicorn asks of a listener: ``close()``, ``wait_closed()`` (and ``sockets``)."""

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
        """Wait until fewer than ``max_tls_handshakes`` handshakes are under way, dropping the oldest once
        it is ``STALE_HANDSHAKE`` old, so that silent clients cannot hold every slot."""
        guard, loop = self.guard, self._loop
        while len(guard.handshakes) >= guard.limits.max_tls_handshakes:
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
            await self._loop.connect_accepted_socket(self.factory, conn, ssl=self.context,
                                                     ssl_handshake_timeout=limits.tls_handshake_timeout_seconds,
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
    """While the block runs, a :class:`GuardedListener` opens ``sockets`` when uvicorn asks the
    running loop's ``create_server`` to; any other call goes to the loop's own."""
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


async def trim_memory(guard: ConnectionGuard, interval: float = 5.0, after_connections: int = 128) -> None:
    """Every ``interval`` seconds, the heap handed back to the OS (:func:`~volcano_job_webhook.memory.trim`,
    in a thread) once ``after_connections`` connections were let go since the last trim:
    bench/fuzz.py's slow attack, RSS back within 20 MB (without it: +157 MB, the peak kept)."""
    trimmed = 0
    while True:
        await asyncio.sleep(interval)
        if guard.gone - trimmed < after_connections:
            continue
        trimmed = guard.gone
        try:
            await asyncio.to_thread(trim)
        except Exception:  # a failed trim must not stop the server
            log.exception("memory trim failed")
