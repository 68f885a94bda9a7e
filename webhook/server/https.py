"""The HTTPS-only uvicorn server: :class:`HTTPSServer`, :func:`build_server`, :func:`serve`.

It serves over the context of a :class:`~volcano_job_webhook.certs.reload.CertReloader` and nothing
else: no plaintext listener is ever opened. How the context reaches uvicorn:
``uvicorn.Config(ssl_context_factory=...)`` — uvicorn's supported hook — returns our context from
``Config.load()``; ``Server._serve`` calls ``load()`` only when ``config.loaded`` is false and then
hands ``config.ssl`` to every ``loop.create_server``. Because the factory returns the same object
whenever it is called, nothing can swap in a context of uvicorn's own making, and
:class:`HTTPSServer` refuses to start if ``config.ssl`` is anything else.

Beyond that hook the server stands on uvicorn's internals (``Server.startup``/``shutdown`` and
their ``sockets`` parameter, ``Server.servers``, ``Server.lifespan``, the ``loop.create_server``
call inside ``startup``), and :mod:`.connections` subclasses uvicorn's ``HttpToolsProtocol``. None of that is
public API: pyproject.toml pins uvicorn to the releases the tests ran on, and
tests/test_uvicorn_internals.py checks each internal by name, so an upgrade that moves one fails
there instead of serving without a limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import socket
import ssl
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import uvicorn

from volcano_job_webhook.certs.reload import CertReloader


class ListenError(Exception):
    """The listening socket could not be opened (the port taken, an address not this host's).

    Not an ``OSError``: uvicorn's ``startup`` turns one into a bare errno log line and exit status 3;
    this one reaches the caller, which says which address and port, and what to do."""

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


class HTTPSServer(uvicorn.Server):
    """uvicorn's server serving only over :attr:`reloader`'s context, with the reloader's watch
    running from startup to shutdown. ``run()`` (blocking) or ``await serve()``; set
    ``should_exit = True`` to stop gracefully.

    ``handshake_timeout`` and ``shutdown_timeout`` bound the TLS handshake and the TLS close of every
    connection (asyncio's and uvloop's defaults are 60 s and 30 s: a client that opens TCP
    connections and never says hello, or never answers a close, would hold each that long); uvicorn
    does not pass these to ``create_server``, so they are bound to the loop's ``create_server``
    while uvicorn opens its listeners. ``create_server``, when given, is called there instead of the
    loop's own (same signature; it gets those timeouts too): a listener that accepts under limits.

    ``receive_buffer`` sets ``SO_RCVBUF`` of the listening sockets, which accepted connections
    inherit: the TLS layer reads what the kernel holds into a 256 KiB buffer per connection and
    keeps the pages it touched for the connection's life, so a small kernel buffer bounds what a
    client sending in bursts can make each connection keep (measured: 2,000 connections sending
    250 KB each, 255 MB resident with the default buffer, 173 MB with 16 KiB). ``background``
    coroutines run as tasks from startup to shutdown.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        reloader: CertReloader,
        *,
        handshake_timeout: float | None = None,
        shutdown_timeout: float | None = None,
        receive_buffer: int | None = None,
        background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
        create_server: Callable[..., Any] | None = None,
    ) -> None:
        super().__init__(config)
        self.create_server = create_server
        self.reloader = reloader
        self.handshake_timeout = handshake_timeout
        self.shutdown_timeout = shutdown_timeout
        self.receive_buffer = receive_buffer
        self.background = background
        self._tasks: list[asyncio.Task[None]] = []

    async def startup(self, sockets: list[Any] | None = None) -> None:
        # HTTPS only: uvicorn opens a plaintext listener when config.ssl is None; never let it.
        if self.config.ssl is not self.reloader.context:
            raise RuntimeError("refusing to start: the listener would not use the webhook's TLS context")
        loop = asyncio.get_running_loop()
        timeouts = {name: value for name, value in (("ssl_handshake_timeout", self.handshake_timeout),
                                                    ("ssl_shutdown_timeout", self.shutdown_timeout)) if value is not None}
        opener = functools.partial(self.create_server or loop.create_server, **timeouts)

        async def create_server(*args: Any, **kwargs: Any) -> Any:
            try:
                return await opener(*args, **kwargs)
            except OSError as exc:
                raise ListenError(self.config.host, self.config.port, exc) from exc

        loop.create_server = create_server  # type: ignore[method-assign]
        try:
            await super().startup(sockets)
        except ListenError:
            await self.lifespan.shutdown()  # what uvicorn does before its exit on an OSError
            raise
        finally:
            del loop.create_server  # the instance attribute: the loop's own method again
        if self.receive_buffer is not None:
            # Accepted sockets inherit the listener's buffer size (Linux), so set it once here.
            for server in getattr(self, "servers", []):
                for sock in server.sockets or []:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
        self.reloader.start()
        self._tasks = [loop.create_task(factory()) for factory in self.background]

    async def shutdown(self, sockets: list[Any] | None = None) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        await self.reloader.stop()
        await super().shutdown(sockets)

    @property
    def addresses(self) -> list[Any]:
        """``getsockname()`` of every listening socket (the real port when bound to port 0)."""
        return [sock.getsockname() for server in getattr(self, "servers", []) for sock in (server.sockets or [])]


def build_server(
    app: Any,
    host: str,
    port: int,
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    *,
    client_ca_file: str | os.PathLike[str] | None = None,
    reload_interval: float = 10.0,
    log_config: dict[str, Any] | str | None = None,
    handshake_timeout: float | None = None,
    shutdown_timeout: float | None = None,
    receive_buffer: int | None = None,
    background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
    create_server: Callable[..., Any] | None = None,
    **uvicorn_kwargs: Any,
) -> HTTPSServer:
    """A configured, not yet started, HTTPS-only uvicorn server for ``app`` (its reloader is
    ``server.reloader``). ``port=0`` picks a free port (see :attr:`HTTPSServer.addresses`).

    ``log_config=None`` leaves logging to the application (uvicorn's loggers propagate to it).
    ``handshake_timeout``, ``shutdown_timeout``, ``receive_buffer``, ``background`` and
    ``create_server``: see :class:`HTTPSServer`. ``ssl_*`` keywords are
    refused: TLS is configured here only. Raises ``ssl.SSLError``/``OSError``
    when the certificate pair or the client CA does not load.
    """
    ssl_kwargs = sorted(k for k in uvicorn_kwargs if k.startswith("ssl_"))
    if ssl_kwargs:
        raise TypeError(f"TLS is configured by build_server itself; unexpected {', '.join(ssl_kwargs)}")
    reloader = CertReloader(cert_file, key_file, client_ca_file, reload_interval)

    def context_factory(config: uvicorn.Config, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        # uvicorn's default would build a second, unmanaged context; ours is the only one. Offer the
        # ALPN protocols of the HTTP implementation uvicorn picked, as its own factory would.
        alpn = getattr(config.http_protocol_class, "alpn_protocols", None)
        if alpn:
            reloader.context.set_alpn_protocols(list(alpn))
        return reloader.context

    uvicorn_kwargs.setdefault("timeout_graceful_shutdown", 10)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        # Recorded for introspection and uvicorn's "https://" log line; the factory does the loading.
        ssl_certfile=os.fspath(cert_file),
        ssl_keyfile=os.fspath(key_file),
        ssl_context_factory=context_factory,
        log_config=log_config,
        **uvicorn_kwargs,
    )
    return HTTPSServer(config, reloader, handshake_timeout=handshake_timeout, shutdown_timeout=shutdown_timeout,
                       receive_buffer=receive_buffer, background=background, create_server=create_server)


def serve(
    app: Any, host: str, port: int, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str], **options: Any
) -> None:
    """Serve ``app`` over HTTPS until SIGINT/SIGTERM (uvicorn stops gracefully on both); blocks.
    ``options`` are :func:`build_server`'s keywords."""
    build_server(app, host, port, cert_file, key_file, **options).run()
