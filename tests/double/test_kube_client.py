"""What kube/rest.py relies on in the official ``kubernetes`` client, and what it promises on top,
checked against a local stub server: a client release that changes any of it fails here rather
than in a cluster.

``Rest`` calls ``ApiClient.call_api`` with its own URL and headers, and needs from the client: the
request sent as given (headers untouched, a dict or list body encoded as JSON for the JSON and
apply content types), the answer handed back unread (a watch streams it, line by line as urllib3's
``HTTPResponse`` iterates it) and not raised on,
``_request_timeout`` as a total or a (connect, read) pair, transport failures left as urllib3's
errors, ``Configuration.auth_settings()`` giving ``Bearer <token>`` after running the refresh hook,
``default_headers`` and ``cookie``, and ``connection_pool_maxsize`` read when a REST client is made
(``widen_pool``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.backoff import retry_after
from volcano_job_webhook.kube.rest import Rest, widen_pool
from volcano_job_webhook.plugins.kinds import CONFIG_MAP, Kind


@dataclass
class Seen:
    method: str
    path: str
    query: list[tuple[str, str]]
    headers: dict[str, str]
    body: bytes


class Handler(BaseHTTPRequestHandler):
    """Answers by path: ``/slow?seconds=S`` after S seconds, ``/status/CODE`` with a Status of that
    code, ``?watch=true`` as a watch (one event, then the next once the server's ``release`` is
    set), anything else with ``{"echo": <method>}``."""

    protocol_version = "HTTP/1.1"
    server: Stub

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        url = urlsplit(self.path)
        query = parse_qsl(url.query)
        self.server.requests.append(Seen(self.command, url.path, query, dict(self.headers), self.rfile.read(length)))
        if url.path == "/slow":
            time.sleep(float(dict(query)["seconds"]))
        if "/status/" in url.path:
            code = int(url.path.rpartition("/")[2])
            self._send(code, {"kind": "Status", "code": code, "message": f"answered {code}"}, {"Retry-After": "3"})
        elif ("watch", "true") in query:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._chunk(b'{"type": "ADDED", "object": {"n": 1}}\n')
            if self.server.release.wait(10):
                self._chunk(b'{"type": "ADDED", "object": {"n": 2}}\n')
                self.wfile.write(b"0\r\n\r\n")
        else:
            self._send(200, {"echo": self.command})

    def _send(self, code: int, answer: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(answer).encode()
        self.send_response(code)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer


class Stub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.requests: list[Seen] = []
        self.release = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def api_of(stub: Stub, pool_size: int | None = None) -> client.ApiClient:
    """A client as the kubeconfig and in-cluster loaders leave one: host and a bearer token."""
    configuration = client.Configuration(host=stub.url)
    configuration.api_key = {"authorization": "t0"}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


OBJ = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "ns", "resourceVersion": "7"},
       "data": {"k": "é ü"}}
OPS = [{"op": "test", "path": "/metadata/resourceVersion", "value": "7"}]


@pytest.mark.parametrize(("call", "method", "query", "content_type", "body"), [
    (lambda r: r.get(CONFIG_MAP, "ns", "cm"), "GET", [], "application/json", None),
    (lambda r: r.create(CONFIG_MAP, "ns", OBJ, "me"), "POST", [("fieldManager", "me")], "application/json", OBJ),
    (lambda r: r.replace(CONFIG_MAP, OBJ), "PUT", [], "application/json", OBJ),
    (lambda r: r.apply(CONFIG_MAP, OBJ, "me"), "PATCH", [("fieldManager", "me"), ("force", "true")], "application/apply-patch+yaml", OBJ),
    # A list: the client would send any other body as a strategic merge patch.
    (lambda r: r.json_patch(CONFIG_MAP, "ns", "cm", OPS), "PATCH", [], "application/json-patch+json", OPS),
    (lambda r: r.merge_patch(CONFIG_MAP, "ns", "cm", {"data": None}, "me"), "PATCH", [("fieldManager", "me")],
     "application/merge-patch+json", {"data": None}),
    (lambda r: r.delete(CONFIG_MAP, "ns", "cm", "u1"), "DELETE", [], "application/json",
     {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background", "preconditions": {"uid": "u1"}}),
])
def test_a_call_goes_out_as_built_with_its_body_as_json(stub: Stub, call: Any, method: str, query: list[tuple[str, str]],
                                                       content_type: str, body: Any) -> None:
    api = api_of(stub)
    api.set_default_header("X-Extra", "1")
    api.cookie = "session=c"
    answer = call(Rest(api))
    assert answer in ({"echo": method}, True)
    seen = stub.requests[-1]
    path = "/api/v1/namespaces/ns/configmaps" + ("" if method == "POST" else "/cm")
    assert (seen.method, seen.path, seen.query) == (method, path, query)
    assert seen.headers["Content-Type"] == content_type and seen.headers["Accept"] == "application/json"
    assert seen.headers["Authorization"] == "Bearer t0", "auth_settings() gives the prefixed token"
    assert seen.headers["User-Agent"] == api.user_agent and seen.headers["X-Extra"] == "1" and seen.headers["Cookie"] == "session=c"
    assert (json.loads(seen.body) if seen.body else None) == body


def test_a_name_is_one_path_segment(stub: Stub) -> None:
    """A name that is no valid name yet (a Pod's label, before validation) asks for that name, not another path."""
    assert Rest(api_of(stub)).get(CONFIG_MAP, "ns", "x/../../secrets/y") == {"echo": "GET"}
    assert stub.requests[-1].path == "/api/v1/namespaces/ns/configmaps/x%2F..%2F..%2Fsecrets%2Fy"


def test_an_error_answer_is_an_api_exception_whose_retry_after_is_read(stub: Stub) -> None:
    rest = Rest(api_of(stub))
    with pytest.raises(ApiException) as raised:
        rest.call("POST", "/status/429", body={})  # a POST: urllib3 itself retries a GET's 429 with its Retry-After
    exc = raised.value
    assert exc.status == 429 and json.loads(exc.body)["message"] == "answered 429"
    assert retry_after(exc) == 3.0
    assert rest.get(Kind("", "v1", "X", "status", "x"), "", "404") is None, "404 is no object"


def test_a_watch_is_read_as_it_comes_and_cancelled_at_once(stub: Stub) -> None:
    started = time.monotonic()
    stream = Rest(api_of(stub)).watch("/api/v1/configmaps", [], timeout=30)
    events = iter(stream)
    assert next(events) == {"type": "ADDED", "object": {"n": 1}}
    assert time.monotonic() - started < 5, "the answer came back unread: its first event long before its end (10 s)"
    threading.Timer(0.2, stream.cancel).start()
    started = time.monotonic()
    assert list(events) == [], "cancelled while waiting for the next event: no error, no more events"
    assert time.monotonic() - started < 5
    assert stub.requests[-1].query == [("watch", "true")]


def test_a_watch_that_stalls_past_its_read_timeout_fails(stub: Stub) -> None:
    events = iter(Rest(api_of(stub)).watch("/api/v1/configmaps", [], timeout=0.3))
    next(events)
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        next(events)
    assert time.monotonic() - started < 5


def test_a_request_timeout_is_the_total_and_a_transport_failure_stays_urllib3s(stub: Stub) -> None:
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        Rest(api_of(stub)).call("GET", "/slow", query=[("seconds", "5")], timeout=0.2)
    # urllib3 tries a GET four times by default: 4 × 0.2 s, well before one 5 s answer.
    assert time.monotonic() - started < 4


def test_the_token_comes_through_the_refresh_hook_at_most_once_a_ttl(stub: Stub) -> None:
    api = api_of(stub)
    refreshed = []

    def refresh(configuration: client.Configuration) -> None:
        refreshed.append(True)
        configuration.api_key["authorization"] = f"t{len(refreshed)}"

    api.configuration.refresh_api_key_hook = refresh
    rest = Rest(api)
    for _ in range(5):
        rest.call("GET", "/x")
    assert len(refreshed) == 1 and {r.headers["Authorization"] for r in stub.requests} == {"Bearer t1"}
    rest.AUTH_TTL = 0.0
    rest.call("GET", "/x")
    assert len(refreshed) == 2 and stub.requests[-1].headers["Authorization"] == "Bearer t2"


def held_at_once(api: client.ApiClient, count: int, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Make ``count`` slow requests at once; the warnings of connections the pool threw away."""
    caplog.clear()
    rest = Rest(api)
    threads = [threading.Thread(target=rest.call, args=("GET", "/slow"), kwargs={"query": [("seconds", "0.3")]}) for _ in range(count)]
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return [r.getMessage() for r in caplog.records if "Connection pool is full" in r.getMessage()]


def test_widen_pool_keeps_as_many_connections_as_asked(stub: Stub, caplog: pytest.LogCaptureFixture) -> None:
    api = api_of(stub, pool_size=1)
    assert held_at_once(api, 4, caplog), "a pool of one throws the others away"
    widen_pool(api, 4)
    assert held_at_once(api, 4, caplog) == [], "the widened pool keeps all four"
    widen_pool(api, 2)
    assert api.configuration.connection_pool_maxsize == 4, "never narrowed"
