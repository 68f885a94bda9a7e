"""The HTTPS-only uvicorn server: sockets bound here (a port taken is one line, :class:`ListenError`),
served by ``uvicorn.Server.serve(sockets=...)`` under the :class:`~.connections.ConnectionGuard` and
only over the :class:`~volcano_job_webhook.certs.reload.CertReloader`'s context, so no plaintext
listener is ever opened."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import uvicorn

from volcano_job_webhook.certs.reload import CertReloader

from .connections import ConnectionGuard, ConnectionLimits, accepting, trim_memory

log = logging.getLogger(__name__)


class ListenError(Exception):
    """The listening socket could not be opened; the message says where, why and what to do."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        if error.errno == errno.EADDRINUSE:
            reason = "the address is already in use (another process listens there)"
        elif error.errno == errno.EACCES:
            reason = "permission denied (ports below 1024 need privileges)"
        else:  # an address not this host's, say
            reason = f"{error.strerror or error}; check --host"
        super().__init__(f"cannot listen on {_address(host, port)}: {reason}; choose another port with --port")


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen(host: str, port: int, backlog: int, receive_buffer: int) -> list[socket.socket]:
    """Listening sockets for every address of ``host``:``port`` (``SO_RCVBUF`` set to
    ``receive_buffer``, which accepted sockets inherit); :class:`ListenError` when one cannot be opened."""
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                                  flags=socket.AI_PASSIVE):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ListenError(host, port, exc) from exc
    return sockets


class Draining:
    """ASGI wrapper: once :attr:`draining`, every response says ``Connection: close``, so the API server
    stops reusing its connections to a leaving replica; the server closes none of them itself
    (:meth:`HTTPSServer.on_tick`)."""

    def __init__(self, app: Any) -> None:
        self.app, self.draining = app, False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if not self.draining or scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def closing(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        return await self.app(scope, receive, closing)


class HTTPSServer(uvicorn.Server):
    """uvicorn's server on sockets of its own, accepting under :attr:`guard` and serving only over
    :attr:`reloader`'s context, the reloader's watch and the ``background`` coroutines running while
    it serves."""

    def __init__(self, config: uvicorn.Config, reloader: CertReloader, guard: ConnectionGuard,
                 background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (), drain_seconds: float = 0.0) -> None:
        super().__init__(config)
        self.reloader = reloader
        self.guard = guard
        self.background = background
        self.sockets: list[socket.socket] = []
        self.drain_seconds = drain_seconds
        self._drained_at: float | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        """The first SIGTERM/SIGINT drains (:class:`Draining`) for at least ``drain_seconds``, then until
        no connection is open; a second stops as uvicorn does."""
        if self._drained_at is None and self.drain_seconds > 0 and isinstance(self.config.app, Draining):
            self.config.app.draining = True
            self._drained_at = time.monotonic() + self.drain_seconds
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        # uvicorn's shutdown closes idle connections: one closed as the API server writes a Pod's review
        # onto it is an EOF no POST is retried on, a refused Pod (kubernetes#127335). So wait for the
        # clients to close them; the idle timeout, past client-go's 90 s, bounds the wait.
        if self._drained_at is not None and time.monotonic() >= self._drained_at and not self.guard.open and not self.guard.handshakes:
            self.should_exit = True
        return await super().on_tick(counter)

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets is not None:
            raise ValueError("HTTPSServer opens its own listening sockets")
        config = self.config
        self.sockets = listen(config.host, config.port, config.backlog, self.guard.limits.receive_buffer_bytes)
        log.info("serving HTTPS on %s", ", ".join(f"https://{_address(host, port)}" for host, port, *_ in self.addresses))
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(factory()) for factory in (self.reloader.poll, *self.background)]
        try:
            with self.reloader.on_loop(), accepting(self.guard, self.sockets, self.reloader.context):
                await super().serve(sockets=self.sockets)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            for sock in self.sockets:
                sock.close()

    @property
    def addresses(self) -> list[Any]:
        """``getsockname()`` of every listening socket (the real port when bound to port 0)."""
        return [sock.getsockname() for sock in self.sockets if sock.fileno() != -1]


def build_server(
    app: Any,
    host: str,
    port: int,
    reloader: CertReloader,
    *,
    limits: ConnectionLimits | None = None,
    log_config: dict[str, Any] | str | None = None,
    background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
    drain_seconds: float = 0.0,
    **uvicorn_kwargs: Any,
) -> HTTPSServer:
    """A configured, not yet started, HTTPS-only uvicorn server for ``app`` over ``reloader``'s context,
    clients bounded by a :class:`~.connections.ConnectionGuard` of ``limits`` (serve's defaults when None), the heap
    trimmed after them (:func:`~.connections.trim_memory`); TLS and the HTTP protocol are set here only (their
    uvicorn keywords are refused)."""
    ours = sorted(k for k in uvicorn_kwargs if k.startswith("ssl_") or k in ("http", "ws", "timeout_keep_alive"))
    if ours:
        raise TypeError(f"TLS and the HTTP protocol are configured by build_server itself; unexpected {', '.join(ours)}")
    guard = ConnectionGuard(limits or ConnectionLimits())
    uvicorn_kwargs.setdefault("timeout_graceful_shutdown", 10)
    config = uvicorn.Config(
        Draining(app) if drain_seconds > 0 else app,
        host=host,
        port=port,
        http=guard.protocol,
        ws="none",  # nothing here speaks WebSocket, and an upgraded connection would leave the guard
        # The API server calls the webhook directly, never through a proxy: no X-Forwarded-* to read.
        proxy_headers=False,
        timeout_keep_alive=guard.limits.idle_timeout_seconds,  # type: ignore[arg-type]
        ssl_context_factory=lambda config, default: reloader.context,
        log_config=log_config,
        **uvicorn_kwargs,
    )
    return HTTPSServer(config, reloader, guard, [*background, functools.partial(trim_memory, guard)], drain_seconds)

