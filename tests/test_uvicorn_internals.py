"""The parts of uvicorn the HTTPS server stands on that are not its public API, each checked for the
shape we use, so that a uvicorn release which moves one fails here by name instead of leaving a
server that starts and quietly stops applying a limit.

What we use, and where (``webhook/server/``):

* ``uvicorn.Server.startup(sockets=None)`` and ``shutdown(sockets=None)``, overridden by
  ``https.HTTPSServer`` and reached only through ``Server._serve``, which calls them by keyword;
* inside ``startup``: the running loop's ``loop.create_server(factory, host=, port=, sock=, ssl=,
  backlog=)``, looked up when called — ``HTTPSServer`` shadows it on the loop instance to add the
  TLS timeouts and put ``listener.guarded_create_server`` in its place; protocols made as
  ``config.http_protocol_class(config=, server_state=, app_state=, _loop=)``; the listeners kept in
  ``Server.servers`` (``HTTPSServer.addresses``, the receive buffer), whose ``sockets``, ``close()``
  and ``wait_closed()`` are all uvicorn asks of them (``listener.GuardedServer`` has no more);
* ``uvicorn.Config``'s keywords that ``https.build_server`` and ``run.server_options`` pass, with
  ``ws="none"`` meaning no WebSocket protocol, and ``Config.load()`` calling
  ``ssl_context_factory(config, default)`` once ``config.http_protocol_class`` is set, its result
  becoming ``config.ssl``;
* ``HttpToolsProtocol``, subclassed by ``connections.GuardedHttpToolsProtocol``: the methods it
  extends (same parameters), the state it reads (``parser``, ``transport``, ``loop``, ``cycle``,
  ``pipeline``, ``url``, ``headers``), ``data_received`` feeding ``self.parser`` (the one we make in
  ``connection_made``), and the request cycle's ``response_started``, ``response_complete``,
  ``disconnected``, ``message_event`` and its ``on_response`` being our ``on_response_complete``;
* httptools' ``HttpRequestParser(protocol).set_dangerous_leniencies(lenient_data_after_close=)``;
* the event loop uvicorn picks: ``create_server`` shadowable on the instance, ``create_server`` and
  ``connect_accepted_socket`` taking ``ssl_handshake_timeout`` and ``ssl_shutdown_timeout``.

The last test runs the whole server over loopback and checks that each of these took effect.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import socket
import ssl
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httptools
import pytest
import uvicorn
import uvicorn.config
import uvicorn.server
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from tests.servers import in_thread
from volcano_job_webhook.certs import ensure_certs
from volcano_job_webhook.server.connections import ConnectionGuard, ConnectionLimits, GuardedHttpToolsProtocol, guarded_protocol
from volcano_job_webhook.server.https import HTTPSServer, build_server
from volcano_job_webhook.server.listener import GuardedServer, guarded_create_server
from volcano_job_webhook.server.run import server_options

TIMEOUTS = {"ssl_handshake_timeout", "ssl_shutdown_timeout"}


def changed(what: str, where: str) -> str:
    return (f"uvicorn {uvicorn.__version__} (httptools {httptools.__version__}): {what}. We rely on it in {where}; "
            "adapt it there, then move the uvicorn pin in pyproject.toml")


def function_tree(func: Callable[..., Any]) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(func)))


def calls(func: Callable[..., Any], callee: str) -> list[ast.Call]:
    """The calls in ``func``'s source whose callee reads ``callee`` (e.g. ``loop.create_server``)."""
    return [node for node in ast.walk(function_tree(func)) if isinstance(node, ast.Call) and ast.unparse(node.func) == callee]


def assigned_attributes(func: Callable[..., Any]) -> set[str]:
    """``self.X`` assigned anywhere in ``func``."""
    targets: list[ast.expr] = []
    for node in ast.walk(function_tree(func)):
        if isinstance(node, ast.Assign):
            targets += node.targets
        elif isinstance(node, ast.AnnAssign):
            targets.append(node.target)
    return {t.attr for t in targets if isinstance(t, ast.Attribute) and ast.unparse(t.value) == "self"}


def parameter_names(func: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(func).parameters)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("certs")
    ensure_certs(path)
    return path


async def tiny_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


# uvicorn.Server ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["startup", "shutdown"])
def test_server_startup_and_shutdown_take_sockets(name):
    theirs, ours = getattr(uvicorn.Server, name), getattr(HTTPSServer, name)
    where = f"HTTPSServer.{name} (webhook/server/https.py), which overrides it and calls super().{name}(sockets)"
    assert inspect.iscoroutinefunction(theirs), changed(f"Server.{name} is no longer a coroutine function", where)
    signature = inspect.signature(theirs)
    assert list(signature.parameters) == ["self", "sockets"], changed(f"Server.{name}{signature}", where)
    assert signature.parameters["sockets"].default is None, changed(f"Server.{name}{signature}", where)
    assert parameter_names(ours) == parameter_names(theirs), f"HTTPSServer.{name} no longer matches Server.{name}"


def test_serve_reaches_startup_and_shutdown_by_keyword():
    where = "HTTPSServer.startup/shutdown (webhook/server/https.py): our overrides name the parameter `sockets`"
    for name in ("startup", "shutdown"):
        found = calls(uvicorn.Server._serve, f"self.{name}")
        assert found, changed(f"Server._serve no longer calls self.{name}()", where)
        for call in found:
            keywords = {k.arg for k in call.keywords}
            assert not call.args and keywords <= {"sockets"}, changed(f"Server._serve calls {ast.unparse(call)}", where)
    assert calls(uvicorn.Server._serve, "config.load"), changed("Server._serve no longer calls config.load()",
                                                               "build_server's ssl_context_factory, which load() calls")


def test_startup_opens_its_listeners_with_the_running_loops_create_server():
    where = ("HTTPSServer.startup (webhook/server/https.py), which shadows loop.create_server while uvicorn's startup runs, "
             "and listener.guarded_create_server, which takes its place")
    tree = function_tree(uvicorn.Server.startup)
    loops = [node for node in ast.walk(tree) if isinstance(node, ast.Assign) and ast.unparse(node) == "loop = asyncio.get_running_loop()"]
    assert loops, changed("Server.startup no longer takes the running loop as `loop = asyncio.get_running_loop()`", where)
    opened = calls(uvicorn.Server.startup, "loop.create_server")
    assert opened, changed("Server.startup no longer opens its listeners with loop.create_server", where)
    ours = set(parameter_names(guarded_create_server(ConnectionGuard(ConnectionLimits())))) - {"timeouts"}
    for call in opened:
        keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
        text = ast.unparse(call)
        assert len(call.args) == 1, changed(f"Server.startup calls {text} (one positional argument expected)", where)
        assert set(keywords) <= ours, changed(f"Server.startup passes {sorted(set(keywords) - ours)} to create_server ({text})", where)
        assert keywords.get("ssl") == "config.ssl", changed(f"Server.startup no longer passes ssl=config.ssl ({text})", where)
    assert "servers" in assigned_attributes(uvicorn.Server.startup), changed(
        "Server.startup no longer keeps its listeners in self.servers",
        "HTTPSServer.addresses and its receive buffer (webhook/server/https.py), which read server.sockets of each")


def test_the_listeners_are_asked_only_what_a_guarded_server_has():
    module = ast.parse(inspect.getsource(uvicorn.server))
    used = {node.attr for node in ast.walk(module)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "server"}
    where = "listener.GuardedServer (webhook/server/listener.py), which stands in for asyncio's Server"
    assert {"close", "wait_closed"} <= used, changed(f"uvicorn/server.py no longer closes its listeners as server.close()/wait_closed() ({sorted(used)})", where)
    has = set(dir(GuardedServer)) | assigned_attributes(GuardedServer.__init__)
    missing = sorted(used - has)
    assert not missing, changed(f"uvicorn now uses server.{', server.'.join(missing)} of a listener", where)


def test_startup_makes_protocols_with_the_keywords_ours_takes():
    where = "connections.GuardedHttpToolsProtocol.__init__ (webhook/server/connections.py), passing them on to HttpToolsProtocol"
    made = calls(uvicorn.Server.startup, "config.http_protocol_class")
    assert made, changed("Server.startup no longer makes protocols as config.http_protocol_class(...)", where)
    takes = set(parameter_names(HttpToolsProtocol.__init__)) - {"self"}
    for call in made:
        keywords = {k.arg for k in call.keywords}
        assert not call.args and keywords <= takes, changed(f"Server.startup calls {ast.unparse(call)}; HttpToolsProtocol takes {sorted(takes)}", where)


def test_a_server_has_the_state_we_read(certs):
    server = build_server(tiny_app, "127.0.0.1", 0, certs / "tls.crt", certs / "tls.key", lifespan="off")
    where = "HTTPSServer (webhook/server/https.py) and tests/servers.py's in_thread"
    assert isinstance(server, uvicorn.Server)
    for name, value in (("started", False), ("should_exit", False)):
        assert getattr(server, name, None) is value, changed(f"a new Server has no {name} = {value}", where)
    for name in ("run", "serve", "server_state"):
        assert hasattr(server, name), changed(f"Server has no {name}", where)


# uvicorn.Config ---------------------------------------------------------------------------------


def test_config_takes_every_keyword_we_pass():
    _, options = server_options(ConnectionLimits())
    ours = set(parameter_names(build_server))
    (config,) = calls(build_server, "uvicorn.Config")
    # What build_server names, what server_options adds for uvicorn, build_server's default and the tests' keywords.
    passed = {k.arg for k in config.keywords if k.arg} | {k for k in options if k not in ours} | {
        "timeout_graceful_shutdown", "log_level", "lifespan"}
    takes = set(parameter_names(uvicorn.Config.__init__))
    assert passed <= takes, changed(f"uvicorn.Config no longer takes {sorted(passed - takes)}",
                                    "build_server (webhook/server/https.py) and server_options (webhook/server/run.py)")
    assert uvicorn.config.WS_PROTOCOLS.get("none", "absent") is None, changed(
        'ws="none" no longer means no WebSocket protocol',
        "server_options (webhook/server/run.py): an upgraded connection would leave the connection guard")


def test_load_calls_the_context_factory_once_the_protocol_class_is_known():
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    protocol = guarded_protocol(ConnectionGuard(ConnectionLimits()))
    seen: list[tuple[Any, ...]] = []

    def factory(config: uvicorn.Config, default: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
        seen.append((config, callable(default), getattr(config, "http_protocol_class", None)))
        return context

    config = uvicorn.Config(tiny_app, http=protocol, ws="none", lifespan="off", ssl_context_factory=factory, log_config=None)
    config.load()
    where = "build_server's context_factory (webhook/server/https.py), the one way our context reaches the listeners"
    assert len(seen) == 1, changed(f"Config.load() called ssl_context_factory {len(seen)} times", where)
    assert seen[0][:2] == (config, True), changed("ssl_context_factory is no longer called as factory(config, default)", where)
    assert seen[0][2] is protocol, changed("config.http_protocol_class is not set when ssl_context_factory is called "
                                           "(ALPN of the protocol is offered from it)", where)
    assert config.loaded and config.ssl is context, changed("the factory's context does not become config.ssl", where)
    assert config.http_protocol_class is protocol and config.ws_protocol_class is None, changed(
        "Config.load() no longer uses a protocol class given as http=", "server_options (webhook/server/run.py)")


# HttpToolsProtocol ------------------------------------------------------------------------------


def overridden() -> list[str]:
    return sorted(name for name, value in vars(GuardedHttpToolsProtocol).items()
                  if callable(value) and not name.startswith("__") and hasattr(HttpToolsProtocol, name))


def test_the_protocol_methods_we_extend_keep_their_parameters():
    assert {"connection_made", "connection_lost", "data_received", "on_body", "on_headers_complete"} <= set(overridden())
    for name in overridden():
        theirs, ours = getattr(HttpToolsProtocol, name), getattr(GuardedHttpToolsProtocol, name)
        assert parameter_names(theirs) == parameter_names(ours), changed(
            f"HttpToolsProtocol.{name}{inspect.signature(theirs)}",
            f"GuardedHttpToolsProtocol.{name} (webhook/server/connections.py), which calls super().{name}")


def test_the_protocol_has_the_state_we_read():
    where = "GuardedHttpToolsProtocol (webhook/server/connections.py)"
    assert "parser" in assigned_attributes(HttpToolsProtocol.__init__), changed(
        "HttpToolsProtocol.__init__ no longer makes self.parser", f"{where}: it drops that parser to break a reference cycle")
    assert any(ast.unparse(call.func) == "self.parser.feed_data" for call in ast.walk(function_tree(HttpToolsProtocol.data_received))
               if isinstance(call, ast.Call)), changed("HttpToolsProtocol.data_received no longer feeds self.parser",
                                                      f"{where}: the parser made in connection_made")
    config = uvicorn.Config(tiny_app, lifespan="off", log_config=None)
    config.load()
    loop = asyncio.new_event_loop()
    try:
        protocol = HttpToolsProtocol(config=config, server_state=uvicorn.server.ServerState(), app_state={}, _loop=loop)
        protocol.on_message_begin()
        for name in ("parser", "transport", "loop", "cycle", "pipeline", "url", "headers"):
            assert hasattr(protocol, name), changed(f"HttpToolsProtocol has no {name}", where)
        assert protocol.loop is loop, changed("HttpToolsProtocol no longer keeps the loop it is given as self.loop", where)
    finally:
        loop.close()


def test_the_request_cycle_has_the_state_we_read_and_calls_our_on_response_complete():
    where = "GuardedHttpToolsProtocol.abort, on_body, on_message_complete, on_response_complete (webhook/server/connections.py)"
    state = assigned_attributes(RequestResponseCycle.__init__)
    wanted = {"response_started", "response_complete", "disconnected", "message_event"}
    assert wanted <= state, changed(f"RequestResponseCycle no longer has {sorted(wanted - state)}", where)
    made = calls(HttpToolsProtocol.on_headers_complete, "RequestResponseCycle")
    assert made, changed("HttpToolsProtocol.on_headers_complete no longer makes a RequestResponseCycle", where)
    for call in made:
        on_response = next((ast.unparse(k.value) for k in call.keywords if k.arg == "on_response"), None)
        assert on_response == "self.on_response_complete", changed(f"the request cycle calls back {on_response} when answered", where)


def test_the_parser_answers_the_first_of_pipelined_requests():
    parser = httptools.HttpRequestParser(object())
    try:
        parser.set_dangerous_leniencies(lenient_data_after_close=True)
    except (AttributeError, TypeError) as exc:
        pytest.fail(changed(f"HttpRequestParser.set_dangerous_leniencies(lenient_data_after_close=True) fails: {exc!r}",
                            "GuardedHttpToolsProtocol.connection_made (webhook/server/connections.py), as uvicorn does"))


# The event loop uvicorn runs on -----------------------------------------------------------------


def test_the_loop_uvicorn_picks_takes_our_create_server_and_timeouts():
    factory = uvicorn.Config(tiny_app, log_config=None).get_loop_factory()
    loop = factory() if factory is not None else asyncio.new_event_loop()
    kind = type(loop).__module__ + "." + type(loop).__qualname__
    try:
        def ours(*args: Any, **kwargs: Any) -> None:
            pass

        loop.create_server = ours  # type: ignore[method-assign]
        assert loop.create_server is ours, f"{kind}: create_server cannot be shadowed on the instance (HTTPSServer.startup)"
        del loop.create_server
        assert loop.create_server is not ours
        for name, where in (("create_server", "HTTPSServer.startup (webhook/server/https.py)"),
                            ("connect_accepted_socket", "GuardedServer._handshake (webhook/server/listener.py)")):
            takes = set(parameter_names(getattr(loop, name)))
            assert takes >= TIMEOUTS, f"{kind}.{name} does not take {sorted(TIMEOUTS - takes)}; we pass them in {where}"
        assert parameter_names(loop.sock_accept) == ["sock"], f"{kind}.sock_accept changed (GuardedServer._accept)"
    finally:
        loop.close()


# All of it at work --------------------------------------------------------------------------------


def test_the_whole_server_applies_every_hook_over_loopback(certs):
    """Each internal above, taking effect: uvicorn opens its listener through our create_server with
    our context and timeouts, keeps it in ``servers``, serves with our protocol, and runs the
    reloader's watch and the background tasks from startup to shutdown."""
    limits = ConnectionLimits(handshake_timeout=3.0, shutdown_timeout=1.5, receive_buffer_bytes=32 * 1024)
    guard, options = server_options(limits)
    opened: list[dict[str, Any]] = []
    inner = options["create_server"]

    async def recording(*args: Any, **kwargs: Any) -> Any:
        opened.append(kwargs)
        return await inner(*args, **kwargs)

    lived: list[str] = []

    async def background() -> None:
        lived.append("started")
        try:
            await asyncio.Event().wait()
        finally:
            lived.append("cancelled")

    options["create_server"] = recording
    options["background"] = [*options["background"], background]
    server = build_server(tiny_app, "127.0.0.1", 0, certs / "tls.crt", certs / "tls.key", log_level="warning", lifespan="off", **options)
    with in_thread(server):
        assert len(opened) == 1, "uvicorn did not open its listener through loop.create_server (HTTPSServer.startup)"
        assert opened[0]["ssl"] is server.reloader.context, "the listener is not serving the reloader's context"
        assert opened[0]["ssl_handshake_timeout"] == 3.0 and opened[0]["ssl_shutdown_timeout"] == 1.5
        assert server.servers and all(isinstance(s, GuardedServer) for s in server.servers), "Server.servers is not our listeners"
        listening = [sock for s in server.servers for sock in s.sockets]
        assert [sock.getsockname() for sock in listening] == server.addresses
        assert all(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) in (32 * 1024, 64 * 1024) for sock in listening)
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            reply = b""
            while chunk := tls.recv(65536):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 ") and reply.endswith(b"ok"), reply
        assert guard.peak_open == 1, "the connection was not served by GuardedHttpToolsProtocol"
        task = server.reloader._task
        assert task is not None and not task.done(), "the reloader's watch is not running"
        assert lived == ["started"]
    assert server.reloader._task is None and task.done(), "the reloader's watch outlived the server"
    assert lived == ["started", "cancelled"]
