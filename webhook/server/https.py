"""The HTTPS-only uvicorn server: :class:`HTTPSServer`, :func:`build_server`, :func:`serve`.

It binds its listening sockets itself (a port taken is a :class:`ListenError`, said in one line) and
hands them to ``uvicorn.Server.serve(sockets=...)``, where :func:`.connections.accepting` accepts
on them under a :class:`~.connections.ConnectionGuard` and wraps every connection in the context of a
:class:`~volcano_job_webhook.certs.reload.CertReloader`: no plaintext listener is ever opened.
uvicorn's own ``ssl_context_factory`` returns that same context, so nothing uvicorn could open
itself would be plaintext either.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import uvicorn

from volcano_job_webhook.certs.reload import CertReloader

from .connections import ConnectionGuard, ConnectionLimits, accepting

log = logging.getLogger(__name__)


class ListenError(Exception):
    """The listening socket could not be opened (the port taken, an address not this host's); the
    message says which address and port, and what to do."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        self.host, self.port, self.error = host, port, error
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if error.errno == errno.EADDRINUSE:
            reason = "the address is already in use (another process listens there)"
        elif error.errno == errno.EACCES:
            reason = "permission denied (ports below 1024 need privileges)"
        else:  # an address not this host's, say
            reason = f"{error.strerror or error}; check --host"
        super().__init__(f"cannot listen on {address}: {reason}; choose another port with --port")


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


class HTTPSServer(uvicorn.Server):
    """uvicorn's server on sockets of its own, accepting under :attr:`guard` and serving only over
    :attr:`reloader`'s context, with the reloader's watch and the ``background`` coroutines running
    as tasks while it serves. ``run()`` (blocking) or ``await serve()``; set ``should_exit = True``
    to stop gracefully."""

    def __init__(self, config: uvicorn.Config, reloader: CertReloader, guard: ConnectionGuard,
                 background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = ()) -> None:
        super().__init__(config)
        self.reloader = reloader
        self.guard = guard
        self.background = background
        self.sockets: list[socket.socket] = []

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets is not None:
            raise ValueError("HTTPSServer opens its own listening sockets")
        config = self.config
        self.sockets = listen(config.host, config.port, config.backlog, self.guard.limits.receive_buffer_bytes)
        log.info("serving HTTPS on %s", ", ".join(_url(address) for address in self.addresses))
        self.reloader.start()
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(factory()) for factory in self.background]
        try:
            with accepting(self.guard, self.sockets, self.reloader.context):
                await super().serve(sockets=self.sockets)
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await self.reloader.stop()
            for sock in self.sockets:
                sock.close()

    @property
    def addresses(self) -> list[Any]:
        """``getsockname()`` of every listening socket (the real port when bound to port 0)."""
        return [sock.getsockname() for sock in self.sockets if sock.fileno() != -1]


def _url(address: Any) -> str:
    host, port = address[0], address[1]
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def build_server(
    app: Any,
    host: str,
    port: int,
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    *,
    guard: ConnectionGuard | None = None,
    client_ca_file: str | os.PathLike[str] | None = None,
    reload_interval: float = 10.0,
    log_config: dict[str, Any] | str | None = None,
    background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
    **uvicorn_kwargs: Any,
) -> HTTPSServer:
    """A configured, not yet started, HTTPS-only uvicorn server for ``app`` (its reloader is
    ``server.reloader``). ``port=0`` picks a free port (see :attr:`HTTPSServer.addresses`).

    ``guard`` (default: one with :class:`~.connections.ConnectionLimits`' defaults) bounds what
    clients can hold; ``log_config=None`` leaves logging to the application (uvicorn's loggers
    propagate to it); ``background``: see :class:`HTTPSServer`. TLS and the HTTP protocol are
    configured here only: ``ssl_*``, ``http``, ``ws`` and ``timeout_keep_alive`` keywords are
    refused. Raises ``ssl.SSLError``/``OSError`` when the certificate pair or the client CA does
    not load.
    """
    ours = sorted(k for k in uvicorn_kwargs if k.startswith("ssl_") or k in ("http", "ws", "timeout_keep_alive"))
    if ours:
        raise TypeError(f"TLS and the HTTP protocol are configured by build_server itself; unexpected {', '.join(ours)}")
    if guard is None:
        guard = ConnectionGuard(ConnectionLimits())
    reloader = CertReloader(cert_file, key_file, client_ca_file, reload_interval)
    uvicorn_kwargs.setdefault("timeout_graceful_shutdown", 10)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=guard.protocol,
        ws="none",  # nothing here speaks WebSocket, and an upgraded connection would leave the guard
        timeout_keep_alive=guard.limits.idle_timeout,  # type: ignore[arg-type]
        ssl_context_factory=lambda config, default: reloader.context,
        log_config=log_config,
        **uvicorn_kwargs,
    )
    return HTTPSServer(config, reloader, guard, background)


def serve(
    app: Any, host: str, port: int, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str], **options: Any
) -> None:
    """Serve ``app`` over HTTPS until SIGINT/SIGTERM (uvicorn stops gracefully on both); blocks.
    ``options`` are :func:`build_server`'s keywords."""
    build_server(app, host, port, cert_file, key_file, **options).run()
