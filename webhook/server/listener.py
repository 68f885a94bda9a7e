"""Accepting connections under the guard's limits, before any TLS work is spent on them.

asyncio's (and uvloop's) server accepts every connection the kernel hands it and starts a TLS
handshake at once: measured, 2,000 TCP connections that never sent a ClientHello cost the server
104 MB (an SSL object and buffers each), uncounted and untimed until the handshake timeout, and a
flood of handshakes is all the event loop does. :func:`guarded_create_server` takes the place of
``loop.create_server`` (uvicorn calls it; :class:`~.https.HTTPSServer`
binds it): one task accepts on each listening socket and, for every socket accepted,

* makes room under ``max_connections`` (handshakes under way count too) by dropping the
  connection that has waited longest, or — when every connection is busy answering — closes the
  new socket at once, before a single byte of TLS;
* runs the handshake (``connect_accepted_socket``, with the handshake timeout) as a task of its
  own, at most ``max_handshakes`` at a time. Until one ends, the next socket waits (and the ones
  after it in the kernel's backlog, costing the server nothing); a handshake still under way after
  ``STALE_HANDSHAKE`` seconds is dropped for it, so clients that never finish their hello cannot
  hold the door shut.

Why so few at a time: the event loop runs every handshake whose bytes have arrived in one go, about
0.6 ms of CPU each here. Profiled under a flood of 600 new connections a second, the loop stalled
for up to a second inside ``do_handshake`` with 128 allowed, while requests on connections already
open waited; 16 at a time bounds that stall to about 10 ms.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any

from .connections import ConnectionGuard

log = logging.getLogger(__name__)

# accept() failing for lack of file descriptors or memory: wait a moment rather than spin.
_RESOURCE_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
# A TLS handshake takes two round trips; one still going after this long may be dropped for another.
STALE_HANDSHAKE = 0.25


def _listen(host: str | None, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for ``host``:``port``, as ``loop.create_server`` would open them."""
    sockets = []
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                                  flags=socket.AI_PASSIVE):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class GuardedServer:
    """What ``loop.create_server`` returns, as far as uvicorn uses it: ``sockets``, ``close()`` and
    ``wait_closed()``."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol], sockets: list[socket.socket],
                 context: ssl.SSLContext | None, timeouts: dict[str, float]) -> None:
        self.guard = guard
        self.factory = factory
        self.sockets = sockets
        self.context = context
        self.timeouts = timeouts if context is not None else {}
        self._loop = asyncio.get_running_loop()
        self._slot_freed = asyncio.Event()
        self._accepting = [self._loop.create_task(self._accept(sock), name="accept") for sock in sockets]

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
            try:
                await asyncio.wait_for(self._slot_freed.wait(), max(0.005, STALE_HANDSHAKE - age))
            except TimeoutError:
                pass

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
        try:
            await self._loop.connect_accepted_socket(self.factory, conn, ssl=self.context, **self.timeouts)
        except (TimeoutError, OSError, ssl.SSLError, asyncio.CancelledError):
            conn.close()  # the transport, if any, was closed by the loop already

    def _handshake_done(self, task: asyncio.Task[Any]) -> None:
        self.guard.handshakes.pop(task, None)
        self.guard.gone += 1
        self._slot_freed.set()
        if not task.cancelled() and task.exception() is not None:
            log.warning("TLS connection setup failed: %r", task.exception())

    def close(self) -> None:
        for task in self._accepting:
            task.cancel()
        for task in list(self.guard.handshakes):
            task.cancel()
        for sock in self.sockets:
            sock.close()

    async def wait_closed(self) -> None:
        await asyncio.gather(*self._accepting, return_exceptions=True)

    def is_serving(self) -> bool:
        return any(not task.done() for task in self._accepting)


def guarded_create_server(guard: ConnectionGuard) -> Callable[..., Any]:
    """A stand-in for ``loop.create_server(factory, host, port, *, sock, ssl, backlog,
    ssl_handshake_timeout, ssl_shutdown_timeout)`` that accepts under ``guard``."""

    async def create_server(factory: Callable[[], asyncio.Protocol], host: str | None = None, port: int = 0, *,
                            sock: socket.socket | None = None, ssl: ssl.SSLContext | None = None, backlog: int = 100,
                            **timeouts: Any) -> GuardedServer:
        if sock is not None:
            sock.setblocking(False)
        sockets = [sock] if sock is not None else _listen(host, port, backlog)
        return GuardedServer(guard, factory, sockets, ssl, {k: v for k, v in timeouts.items() if v is not None})

    return create_server
