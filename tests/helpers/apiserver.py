"""An in-process double of the Kubernetes API server: the real REST paths over plain HTTP on
127.0.0.1, so the official ``kubernetes`` client and the product talk to it unchanged. It keeps two
kinds of capability, and nothing else (docs/architecture.md's tests table says which tests use which):

* (a) what a real server cannot stage on cue: injected error answers (``fail_next``) and cut
  connections (``drop_next``), watches ended (``close_watches``), a bookmark now
  (``send_bookmarks``), 410 Expired (``expire_history``), a restart, the log of requests read at
  once, and the store written and read without requests (``put_object``, ``load``: bench/scale.py's
  400,000 objects in seconds);
* (b) what a machine without kube-apiserver must still cover, held to kube-apiserver by
  tests/double/test_apiserver_double.py: the kinds the product uses and CRDs, kube-apiserver's Status
  errors, the four PATCH types (strategic merge served as merge, apply without field ownership),
  status subresources, paged and label-selected lists, and watches.

Admission, authorization, schemas, field ownership, finalizers, graceful deletion,
garbage collection, selectors beyond ``key=value``, ``key`` and ``metadata.name``, subresources but
``status``, and a list's pages as one snapshot are the real server's to test.
"""

from __future__ import annotations

import base64
import bisect
import copy
import http.server
import json
import random
import re
import select
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

import jsonpatch
import kubernetes.client
import orjson
import yaml

from tests.helpers.envtest import write_kubeconfig

Obj = dict[str, Any]


# Resource types ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceType:
    """One REST resource: where it lives and which server-side rules apply."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    custom: bool = False  # a CRD: items keep kind in lists
    status: bool = False  # a status subresource: status written only through <name>/status

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``plural.group`` as in error messages and kubectl (``jobs.batch.volcano.sh``)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


CRD = ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                   namespaced=False, status=True)
MUTATING = ResourceType("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                        "MutatingWebhookConfiguration", namespaced=False)
VALIDATING = ResourceType("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                          "ValidatingWebhookConfiguration", namespaced=False)

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False),
    ResourceType("", "v1", "configmaps", "ConfigMap"),
    ResourceType("", "v1", "secrets", "Secret"),
    ResourceType("", "v1", "services", "Service"),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount"),
    ResourceType("", "v1", "pods", "Pod", status=True),
    ResourceType("", "v1", "events", "Event"),
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    MUTATING,
    VALIDATING,
    CRD,
    ResourceType("batch.volcano.sh", "v1alpha1", "jobs", "Job", custom=True, status=True),
)


def resource_types_of(crd: Obj) -> list[ResourceType]:
    """The resource types a CustomResourceDefinition serves: one per served version."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for version in spec.get("versions") or []:
        if version.get("served", True):
            out.append(ResourceType(spec["group"], version["name"], names["plural"], names["kind"],
                                    namespaced=spec.get("scope", "Namespaced") == "Namespaced", custom=True,
                                    status="status" in (version.get("subresources") or {})))
    return out


# Errors as Status objects ------------------------------------------------------------------------


class ApiError(Exception):
    """A failure answered as a ``Status`` object (what the real server sends)."""

    def __init__(self, code: int, reason: str | None, message: str,
                 details: Obj | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details, self.headers = details, headers or {}

    def status(self) -> Obj:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str | None, message: str, details: Obj | None = None) -> Obj:
    """A ``Failure`` Status with the field layout of kube-apiserver."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                 "status": "Failure", "message": message}
    if reason:
        body["reason"] = reason
    if details:
        body["details"] = details
    body["code"] = code
    return body


def _details(name: str, group: str, kind: str) -> Obj:
    """A Status's ``details`` (``group`` omitted when empty, as Go's ``omitempty`` does)."""
    return {"name": name, **({"group": group} if group else {}), "kind": kind}


def _not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(name, rt.group, rt.plural))


def _conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}', _details(name, rt.group, rt.plural))


_STALE = "the object has been modified; please apply your changes to the latest version and try again"


def _invalid(rt: ResourceType, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; ``causes`` are (field, message, reason) triples."""
    text = ", ".join(f"{f}: {m}" for f, m, _ in causes)
    msg = f'{rt.kind}.{rt.group} "{name}" is invalid: ' if rt.group else f'{rt.kind} "{name}" is invalid: '
    msg += f"[{text}]" if len(causes) > 1 else text
    return ApiError(422, "Invalid", msg, {**_details(name, rt.group, rt.kind),
                                          "causes": [{"reason": r, "message": m, "field": f} for f, m, r in causes]})


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


_DEFAULT_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                    405: "MethodNotAllowed", 409: "Conflict", 410: "Expired", 413: "RequestEntityTooLarge",
                    415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
                    500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


# Selectors ---------------------------------------------------------------------------------------


def parse_label_selector(selector: str | None) -> dict[str, str | None]:
    """A ``labelSelector`` of ``key=value`` and ``key`` (exists) terms, what the product and the
    scenarios send, as a map (None: any value); 400 BadRequest naming anything else, so a test that
    needs more fails saying so."""
    wanted: dict[str, str | None] = {}
    for term in filter(None, (t.strip() for t in (selector or "").split(","))):
        m = re.fullmatch(r"([\w./-]+)(?:\s*==?\s*([\w.-]*))?", term)
        if m is None:
            raise _bad_request(f"the API-server double serves only key=value and key label selectors, not {term!r}")
        wanted[m.group(1)] = m.group(2)
    return wanted


@dataclass(frozen=True)
class _Filter:
    """What a list or watch asks for: namespace, label selector, and for a single-object watch a name."""

    namespace: str | None
    labels: dict[str, str | None]
    name: str | None = None

    def matches(self, obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if self.name is not None and meta.get("name") != self.name:
            return False
        labels = meta.get("labels") or {}
        return all(k in labels and v in (None, labels[k]) for k, v in self.labels.items())


def _named(query: dict[str, str]) -> str | None:
    """The name of a ``fieldSelector`` of ``metadata.name=NAME`` (the one field selector the product sends)."""
    selector = query.get("fieldSelector") or ""
    return selector.removeprefix("metadata.name=") if selector.startswith("metadata.name=") else None


# Patches -----------------------------------------------------------------------------------------


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, null deletes, lists replace."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


# Storage, history and garbage collection ---------------------------------------------------------


@dataclass(frozen=True)
class WatchEvent:
    """One committed write, kept for watch replay."""

    rv: int
    resource: tuple[str, str]
    type: str  # ADDED | MODIFIED | DELETED
    object: Obj
    old: Obj | None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _drop_empty_meta(obj: Obj) -> None:
    """ObjectMeta fields are ``omitempty``: an empty map or list is stored as absent."""
    meta = obj["metadata"]
    for k in ("labels", "annotations", "ownerReferences"):
        if k in meta and not meta[k]:
            del meta[k]


@dataclass(frozen=True)
class _Encoded:
    """An answer already encoded as JSON: a list, encoded under the store's lock so that none of
    its objects is copied (a page of 500 Jobs took 0.25 s to deep-copy and encode otherwise)."""

    data: bytes


def _without_rv(obj: Obj) -> Obj:
    out = dict(obj)
    out["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
    return out


class _Store:
    """Objects, the global resourceVersion and the event history; call every method with ``lock`` held
    (``cond``, on the same lock, is notified after each commit and when watches must end)."""

    def __init__(self, resources: Iterable[ResourceType], history_limit: int) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self.rv = 0
        self.history: list[WatchEvent] = []
        self.history_rvs: list[int] = []
        self.floor = 0  # a watch from rv R is servable iff R >= floor
        self.history_limit = history_limit
        self.epoch = 0  # bumped to end every open watch
        self.next_ip = 0
        for rt in resources:
            self.register(rt)

    def register(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt
        self.objects.setdefault(rt.key, {})

    def type_of(self, obj: Obj) -> ResourceType:
        group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
        for rt in self.types.values():
            if (rt.group, rt.version, rt.kind) == (group, version, obj.get("kind")):
                return rt
        raise ValueError(f"no resource registered for {obj.get('apiVersion')} {obj.get('kind')}")

    # -- commits -----------------------------------------------------------

    def commit(self, rt: ResourceType, kind: str, obj: Obj, old: Obj | None) -> Obj:
        """Store (or remove, for DELETED) ``obj`` at a new resourceVersion and record the event."""
        self.rv += 1
        _drop_empty_meta(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if kind == "DELETED":
            self.objects[rt.key].pop(key, None)
        else:
            self.objects[rt.key][key] = obj
            if rt.key == CRD.key:  # a stored CRD is served at once (the real server takes a moment)
                for served in resource_types_of(obj):
                    self.register(served)
        self.history.append(WatchEvent(self.rv, rt.key, kind, copy.deepcopy(obj), copy.deepcopy(old)))
        self.history_rvs.append(self.rv)
        if len(self.history) > self.history_limit:
            drop = len(self.history) - self.history_limit
            self.floor = self.history_rvs[drop - 1]
            del self.history[:drop], self.history_rvs[:drop]
        self.cond.notify_all()
        return copy.deepcopy(obj)

    def expire(self, bump: bool) -> None:
        """Forget the history: every resourceVersion known so far becomes too old (if ``bump``)."""
        if bump:
            self.rv += 1
        self.history.clear()
        self.history_rvs.clear()
        self.floor = self.rv
        self.cond.notify_all()

    def events_after(self, rv: int) -> list[WatchEvent]:
        return self.history[bisect.bisect_right(self.history_rvs, rv):]

    def remove(self, rt: ResourceType, obj: Obj) -> Obj:
        return self.commit(rt, "DELETED", copy.deepcopy(obj), obj)


# Server-side defaulting and validation (the part of them that shows up in tests) -----------------


def _reset_status_on_create(rt: ResourceType, obj: Obj) -> None:
    """What create does to ``status``: a custom resource with a status subresource starts without
    one, a Pod starts ``Pending`` (the registries' ``PrepareForCreate``), a CRD is Established at
    once (its controller's work, instant here)."""
    if rt.key == ("", "pods"):
        obj["status"] = {"phase": "Pending"}
    elif rt.key == CRD.key:
        spec = obj.get("spec") or {}
        obj["status"] = {
            "acceptedNames": spec.get("names") or {},
            "storedVersions": [v["name"] for v in spec.get("versions") or [] if v.get("storage")],
            "conditions": [{"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": _now()}
                           for t, r, m in (("NamesAccepted", "NoConflicts", "no conflicts found"),
                                           ("Established", "InitialNamesAccepted", "the initial names have been accepted"))],
        }
    elif rt.status:
        obj.pop("status", None)


def _owner_references_json(refs: list[Any]) -> str:
    """``[]metav1.OwnerReference`` as the API server prints an invalid value: JSON, fields in Go order."""
    order = ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")
    shown = [{k: r[k] for k in order if k in r} if isinstance(r, dict) else r for r in refs]
    return json.dumps(shown, separators=(",", ":"))


def _validate(rt: ResourceType, obj: Obj) -> None:
    """422 Invalid for what the real server refuses and the product could get wrong: a second
    ``controller: true`` owner reference (``ValidateOwnerReferences``)."""
    meta = obj["metadata"]
    refs = meta.get("ownerReferences") or []
    causes: list[tuple[str, str, str]] = []
    first = ""
    for ref in refs:
        if isinstance(ref, dict) and ref.get("controller") is True:
            current = f"{ref.get('kind')}/{ref.get('name')}"
            if not first:
                first = current
                continue
            causes.append(("metadata.ownerReferences", f"Invalid value: {_owner_references_json(refs)}: Only one reference "
                           f'can have Controller set to true. Found "true" in references for {first} and {current}',
                           "FieldValueInvalid"))
    if causes:
        raise _invalid(rt, meta.get("name") or "", causes)


def _apply_defaults(store: _Store, rt: ResourceType, obj: Obj) -> None:
    """Apply the real server's defaulting that a product reads back."""
    if rt.key == ("", "secrets"):
        obj.setdefault("type", "Opaque")
    elif rt.key == ("", "services"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        if spec["type"] != "ExternalName":
            if not spec.get("clusterIP"):
                store.next_ip += 1
                spec["clusterIP"] = f"10.96.{store.next_ip // 250}.{store.next_ip % 250 + 1}"
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")


# Fault injection and request log -----------------------------------------------------------------


@dataclass
class Fault:
    """A pending injected failure; ``remaining`` counts down as requests match."""

    remaining: int
    action: Literal["fail", "drop"]
    status: int = 500
    method: str | None = None
    path_contains: str | None = None
    retry_after: int | None = None

    def matches(self, method: str, target: str) -> bool:
        return (self.remaining > 0
                and (self.method is None or self.method.upper() == method)
                and (self.path_contains is None or self.path_contains in target))


@dataclass
class RequestRecord:
    """One request as the server saw it: its Kubernetes verb (get for discovery, whose ``resource`` is
    empty) and resource, and the HTTP ``status`` answered (0 for a dropped connection)."""

    method: str
    path: str
    query: dict[str, str]
    verb: str
    group: str = ""
    version: str = ""
    resource: str = ""
    namespace: str | None = None
    name: str | None = None
    status: int | None = None
    user_agent: str = ""  # who asked, as the client named itself (``ApiClient.user_agent``)
    subresource: str = ""


@dataclass
class _Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    watch_path: bool  # the deprecated /watch/ prefix
    subresource: str = ""


@dataclass
class _Write:
    """A write: what it would store, and what it replaces."""

    operation: str  # CREATE, UPDATE, DELETE
    rt: ResourceType
    namespace: str | None
    name: str  # "" for a CREATE whose name the server generates
    obj: Obj | None  # the object to store (None for DELETE)
    old: Obj | None  # the stored object it replaces (None for CREATE)
    code: int  # the HTTP status of success
    subresource: str = ""


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


# HTTP plumbing -----------------------------------------------------------------------------------


class _HTTPServer(http.server.ThreadingHTTPServer):
    """A ThreadingHTTPServer whose connection threads the FakeApiServer tracks and ends."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], api: FakeApiServer) -> None:
        self.api = api
        self.conns: dict[Any, threading.Thread] = {}  # open connections, shut by FakeApiServer.stop
        self.conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        def run() -> None:
            try:
                self.process_request_thread(request, client_address)
            finally:
                with self.conns_lock:
                    self.conns.pop(request, None)

        thread = threading.Thread(target=run, daemon=True, name=f"fake-apiserver-conn:{self.server_address[1]}")
        with self.conns_lock:
            self.conns[request] = thread
        thread.start()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Reads a request, hands it to the FakeApiServer, writes JSON or a chunked stream."""

    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: with Nagle's algorithm the body waits for the
        # client's delayed ACK of the headers, 40 ms per request on Linux loopback.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _dispatch(self) -> None:
        self.server.api._handle(self, self.command)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _dispatch

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body.data if isinstance(body, _Encoded) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.end_headers()

    def write_event(self, event: Obj) -> None:
        data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True

    def client_gone(self) -> bool:
        """True once the client has closed its end (a watch has nothing else to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


# The server --------------------------------------------------------------------------------------


class FakeApiServer:
    """A Kubernetes API server double on http://127.0.0.1:``port`` (0: an ephemeral one). Watches from a
    resourceVersion older than the last ``history_limit`` events get 410 Expired."""

    bookmark_interval = 60.0  # seconds between BOOKMARK events on watches that allow them
    watch_timeout = 1800.0  # seconds a watch lasts when the client sends no timeoutSeconds

    def __init__(self, *, history_limit: int = 10_000, port: int = 0) -> None:
        self._store = _Store(DEFAULT_RESOURCES, history_limit)
        self.port = port
        self._httpd: _HTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._faults: list[Fault] = []
        self._requests: list[RequestRecord] = []
        self._log_lock = threading.Lock()
        self._stopping = False
        self._open_watches = 0
        # (resource, namespace, selector) -> (resourceVersion, sorted selected keys): see _selected.
        self._listings: dict[tuple[Any, ...], tuple[int, list[tuple[str, str]]]] = {}

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> FakeApiServer:
        """Listen on 127.0.0.1:``port`` (ephemeral the first time) and serve in the background."""
        if self._httpd is not None:
            return self
        self._stopping = False
        self._httpd = _HTTPServer(("127.0.0.1", self.port), self)
        self.port = self._httpd.server_address[1]
        self._serve_thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                              name=f"fake-apiserver:{self.port}", daemon=True)
        self._serve_thread.start()
        return self

    def stop(self) -> None:
        """End every watch (cleanly), close every connection, join every server thread."""
        if self._httpd is None:
            return
        with self._store.cond:
            self._stopping = True
            self._store.epoch += 1
            self._store.cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        deadline = time.monotonic() + 1.0
        with self._store.cond:  # give watch streams a moment to write their last chunk
            while self._open_watches and time.monotonic() < deadline:
                self._store.cond.wait(0.05)
        with self._httpd.conns_lock:
            conns = list(self._httpd.conns.items())
        for sock, _ in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for _, thread in conns:
            thread.join(timeout=2.0)
        assert self._serve_thread is not None
        self._serve_thread.join(timeout=2.0)
        self._httpd = self._serve_thread = None

    def restart(self, *, keep_history: bool = False) -> None:
        """Go away and come back on the same port with the same objects and, unless ``keep_history``, no
        watch history (as a real restart: a watch from an older resourceVersion gets 410 Expired)."""
        self.stop()
        if not keep_history:
            with self._store.lock:
                self._store.expire(bump=False)
        self.start()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- client configuration -------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configuration(self) -> kubernetes.client.Configuration:
        """A client Configuration for this server (no auth, no proxy)."""
        config = kubernetes.client.Configuration(host=self.url)
        config.proxy = None
        return config

    def api_client(self) -> kubernetes.client.ApiClient:
        """A fresh ``kubernetes.client.ApiClient`` talking to this server."""
        return kubernetes.client.ApiClient(self.configuration())

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig whose current context points here; return ``path``."""
        return str(write_kubeconfig(Path(path), self.url, "fake", namespace="default"))

    # -- fault injection ------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 500, *, method: str | None = None,
                  path_contains: str | None = None, retry_after: int | None = None) -> Fault:
        """Answer the next ``n`` matching requests with a Status error (its reason the real one for
        ``status``) instead of serving them. ``path_contains`` is matched against the request target
        (path and query); ``retry_after`` adds a ``Retry-After`` header and ``details.retryAfterSeconds``."""
        return self._inject(Fault(n, "fail", status, method, path_contains, retry_after))

    def drop_next(self, n: int = 1, *, method: str | None = None, path_contains: str | None = None) -> Fault:
        """Close the connection of the next ``n`` matching requests without any response."""
        return self._inject(Fault(n, "drop", 0, method, path_contains))

    def _inject(self, fault: Fault) -> Fault:
        with self._log_lock:
            self._faults.append(fault)
        return fault

    def close_watches(self) -> int:
        """End every open watch stream now (cleanly); return how many were open."""
        with self._store.cond:
            count = self._open_watches
            self._store.epoch += 1
            self._store.cond.notify_all()
        return count

    def expire_history(self) -> None:
        """Make every resourceVersion handed out so far too old to watch from (410 Expired), as an etcd
        compaction does; the next list's resourceVersion is watchable."""
        with self._store.lock:
            self._store.expire(bump=True)

    def send_bookmarks(self) -> None:
        """Make every watch that allows bookmarks send one now."""
        with self._store.cond:
            self._bookmark_now = time.monotonic()
            self._store.cond.notify_all()

    _bookmark_now = 0.0

    # -- introspection and seeding -------------------------------------------

    @property
    def requests(self) -> list[RequestRecord]:
        """A copy of the request log, oldest first."""
        with self._log_lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._log_lock:
            self._requests.clear()

    def wait_for_watches(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until at least ``count`` watch streams are open; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._store.cond:
            while self._open_watches < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._store.cond.wait(left)
        return True

    def register_resource(self, rt: ResourceType) -> None:
        """Serve one more resource type (e.g. another CRD)."""
        with self._store.lock:
            self._store.register(rt)

    def resource(self, resource: str) -> ResourceType:
        """Resolve ``plural`` or ``plural.group`` (``events`` means core events)."""
        types = list(self._store.types.values())
        exact = [rt for rt in types if rt.qualified == resource]
        by_plural = [rt for rt in types if rt.plural == resource]
        found = exact or [rt for rt in by_plural if rt.group == ""] or by_plural
        if len(found) != 1:
            raise ValueError(f"unknown or ambiguous resource {resource!r}")
        return found[0]

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """Copies of the stored objects of ``resource`` (sorted by namespace, name)."""
        rt = self.resource(resource)
        with self._store.lock:
            objs = self._store.objects[rt.key]
            return [copy.deepcopy(objs[k]) for k in sorted(objs) if namespace is None or k[0] == namespace]

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        rt = self.resource(resource)
        with self._store.lock:
            obj = self._store.objects[rt.key].get(((namespace or "") if rt.namespaced else "", name))
            return copy.deepcopy(obj) if obj else None

    def put_object(self, obj: Obj) -> Obj:
        """Store ``obj`` as another client would (create or overwrite; uid, creationTimestamp and namespace
        filled in, no admission or defaults), with its watch event; return the stored copy."""
        with self._store.lock:
            rt = self._store.type_of(obj)
            new = copy.deepcopy(obj)
            meta = new.setdefault("metadata", {})
            if rt.namespaced:
                meta.setdefault("namespace", "default")
            else:
                meta.pop("namespace", None)
            old = self._store.objects[rt.key].get((meta.get("namespace", ""), meta["name"]))
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            return self._store.commit(rt, "MODIFIED" if old else "ADDED", new, old)

    def load(self, objects: Iterable[Obj]) -> int:
        """Store many objects (taken, not copied) as creates would, admission aside and ``status`` kept,
        with no watch events: the history is forgotten, so a watcher lists again. For stores of a size
        no test makes through requests (bench/scale.py). Returns how many; a taken name is a ValueError."""
        count = 0
        store = self._store
        with store.cond:
            try:
                for obj in objects:
                    rt = store.type_of(obj)
                    self._check_type(rt, obj)
                    meta = obj["metadata"]
                    if rt.namespaced:
                        meta.setdefault("namespace", "default")
                    else:
                        meta.pop("namespace", None)
                    key = (meta.get("namespace", ""), meta.get("name") or "")
                    if not key[1] or key in store.objects[rt.key]:
                        raise ValueError(f"{rt.qualified} {key[0]}/{key[1]}: no name, or the name is taken")
                    meta.setdefault("uid", str(uuid.uuid4()))
                    meta.setdefault("creationTimestamp", _now())
                    _apply_defaults(store, rt, obj)
                    _drop_empty_meta(obj)
                    _validate(rt, obj)
                    store.rv += 1
                    meta["resourceVersion"] = str(store.rv)
                    store.objects[rt.key][key] = obj
                    if rt.key == CRD.key:
                        for served in resource_types_of(obj):
                            store.register(served)
                    count += 1
            finally:
                if count:
                    store.expire(bump=False)
        return count

    def delete_object(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        """Remove an object at once, emit DELETED."""
        rt = self.resource(resource)
        with self._store.lock:
            old = self._store.objects[rt.key].get(((namespace or "") if rt.namespaced else "", name))
            if old is None:
                return None
            return self._store.commit(rt, "DELETED", copy.deepcopy(old), old)

    # -- request handling -----------------------------------------------------

    def _handle(self, h: _Handler, method: str) -> None:
        split = urlsplit(h.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        body = h.read_body()
        record = RequestRecord(method, split.path, query, "get")
        route: _Route | Obj | ApiError
        try:
            route = self._route(split.path)
        except ApiError as err:
            route = err
        if isinstance(route, _Route):
            record = self._describe(record, route)
        record.user_agent = h.headers.get("User-Agent") or ""
        with self._log_lock:
            self._requests.append(record)
            fault = next((f for f in self._faults if f.matches(method, h.path)), None)
            if fault:
                fault.remaining -= 1
        if fault and fault.action == "drop":
            record.status = 0
            h.close_connection = True
            return
        if fault:
            err = ApiError(fault.status, _DEFAULT_REASONS.get(fault.status, "InternalError"), f"injected failure ({fault.status})")
            if fault.retry_after is not None:
                err.details = {"retryAfterSeconds": fault.retry_after}
                err.headers["Retry-After"] = str(fault.retry_after)
            return self._send_error(h, record, err)
        try:
            if isinstance(route, ApiError):
                raise route
            if not isinstance(route, _Route):  # discovery
                record.status = 200
                return h.send_json(200, route)
            if record.verb == "watch":
                record.status = 200
                return self._watch(h, route, query)
            code, result = self._serve(method, route, query, body, h.headers.get("Content-Type") or "")
            record.status = code
            h.send_json(code, result)
        except ApiError as err:
            self._send_error(h, record, err)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
        except Exception as exc:  # a bug here should read as a 500, not a hang
            self._send_error(h, record, ApiError(500, "InternalError", f"fake apiserver: {exc!r}"))

    def _send_error(self, h: _Handler, record: RequestRecord, err: ApiError) -> None:
        record.status = err.code
        h.send_json(err.code, err.status(), err.headers)

    @staticmethod
    def _describe(record: RequestRecord, route: _Route) -> RequestRecord:
        rt, method = route.rt, record.method
        watching = route.watch_path or _truthy(record.query.get("watch"))
        if method == "GET":
            verb = "watch" if watching else ("get" if route.name else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete" if route.name else "deletecollection"}[method]
        return RequestRecord(method, record.path, record.query, verb, rt.group, rt.version, rt.plural,
                             route.namespace, route.name, subresource=route.subresource)

    def _route(self, path: str) -> _Route | Obj:
        """Map a URL path to a resource route, or to a group/version's resource list."""
        parts = [unquote(p) for p in path.strip("/").split("/") if p]
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            return self._resource_list(group, version)
        watch_path = rest[0] == "watch"
        rest = rest[1:] if watch_path else rest
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        rt = self._store.types.get((group, version, rest[0] if rest else ""))
        subresource = rest[2] if len(rest) == 3 else ""
        if (rt is None or len(rest) > 3 or (namespace is not None and not rt.namespaced)
                or (rt.namespaced and namespace is None and len(rest) > 1)
                or (subresource and (subresource != "status" or not rt.status or watch_path))):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _Route(rt, namespace, rest[1] if len(rest) > 1 else None, watch_path, subresource)

    def _resource_list(self, group: str, version: str) -> Obj:
        """An ``APIResourceList`` (discovery), so that clients which look kinds up work here too."""
        resources = []
        for rt in sorted(self._store.types.values(), key=lambda t: t.plural):
            if (rt.group, rt.version) != (group, version):
                continue
            resources.append({"name": rt.plural, "singularName": rt.kind.lower(), "namespaced": rt.namespaced, "kind": rt.kind,
                              "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]})
            if rt.status:
                resources.append({"name": f"{rt.plural}/status", "singularName": "", "namespaced": rt.namespaced,
                                  "kind": rt.kind, "verbs": ["get", "patch", "update"]})
        if not resources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}

    # -- verbs ------------------------------------------------------------------

    def _serve(self, method: str, route: _Route, query: dict[str, str], raw: bytes,
               content_type: str) -> tuple[int, Obj | _Encoded]:
        rt, ns, name = route.rt, route.namespace, route.name
        if method == "GET":
            with self._store.lock:
                if name:
                    return 200, self._present(rt, self._get(rt, ns, name))
                if route.subresource:
                    raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
                return 200, self._list(rt, ns, query)
        creating = method == "POST" and not name and (ns is not None or not rt.namespaced)
        if (creating or (method in ("PUT", "PATCH") and name) or (method == "DELETE" and name and not route.subresource)):
            return self._write(method, route, query, raw, content_type)
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    @staticmethod
    def _present(rt: ResourceType, obj: Obj) -> Obj:
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        return obj

    def _get(self, rt: ResourceType, ns: str | None, name: str) -> Obj:
        obj = self._store.objects[rt.key].get((ns or "", name))
        if obj is None:
            raise _not_found(rt, name)
        return copy.deepcopy(obj)

    def _selected(self, rt: ResourceType, flt: _Filter, selector: str) -> list[tuple[str, str]]:
        """The sorted keys of the objects ``flt`` selects (call with the lock held). Kept until the
        next write, so that each page of a paged list does not sort and filter everything again."""
        cache_key = (rt.key, flt.namespace, selector)
        held = self._listings.get(cache_key)
        if held is not None and held[0] == self._store.rv:
            return held[1]
        objs = self._store.objects[rt.key]
        keys = [k for k in sorted(objs) if flt.matches(objs[k])]
        if len(self._listings) >= 16:
            self._listings.clear()
        self._listings[cache_key] = (self._store.rv, keys)
        return keys

    def _list(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> _Encoded:
        """A page of the list (call with the lock held), encoded before the lock is let go."""
        selector = query.get("labelSelector") or ""
        flt = _Filter(ns, parse_label_selector(selector), _named(query))
        objs = self._store.objects[rt.key]
        keys = self._selected(rt, flt, f"{selector} {flt.name}")
        start = 0
        meta: Obj = {"resourceVersion": str(self._store.rv)}
        if token := query.get("continue"):
            try:
                state = json.loads(base64.urlsafe_b64decode(token))
                after = state["after"]
                if not isinstance(after, list):
                    raise TypeError("after")
                # Keys are (namespace, name) tuples, sorted: the first one past ``after`` is found
                # by bisection, as a list of them compares to ``after`` the way a tuple does.
                start = bisect.bisect_right(keys, tuple(after))
                meta["resourceVersion"] = state["rv"]
            except (ValueError, KeyError, TypeError):
                raise _bad_request("continue key is not valid: incorrect encoded start resourceVersion") from None
        remaining = len(keys) - start
        limit = int(query.get("limit") or 0)
        page = keys[start:start + limit] if 0 < limit < remaining else keys[start:]
        if 0 < limit < remaining:
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": meta["resourceVersion"], "after": list(page[-1])}).encode()).decode()
            if not selector:  # the real server counts what remains only of an unselected list
                meta["remainingItemCount"] = remaining - limit
        if rt.custom:
            items = [objs[k] for k in page]
        else:  # the real server omits TypeMeta on built-in list items
            items = [{f: v for f, v in objs[k].items() if f not in ("kind", "apiVersion")} for k in page]
        # orjson: a tenth of json.dumps's time, for every object a JSON client can store
        return _Encoded(orjson.dumps({"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items}))

    def _check_type(self, rt: ResourceType, obj: Obj) -> None:
        if obj.get("apiVersion") not in (None, "", rt.api_version):
            raise _bad_request(f"the API version in the data ({obj['apiVersion']}) does not match the "
                               f"expected API version ({rt.api_version})")
        if obj.get("kind") not in (None, "", rt.kind):
            raise _bad_request(f"the kind in the data ({obj['kind']}) does not match the expected kind ({rt.kind})")
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        if not isinstance(obj.setdefault("metadata", {}), dict):
            raise _bad_request("metadata must be an object")

    def _check_namespace(self, rt: ResourceType, obj: Obj, ns: str | None) -> None:
        meta = obj["metadata"]
        if not rt.namespaced:
            meta.pop("namespace", None)
        elif meta.get("namespace") not in (None, "", ns):
            raise _bad_request("the namespace of the provided object does not match the namespace sent on the request")
        else:
            meta["namespace"] = ns

    def _write(self, method: str, route: _Route, query: dict[str, str], raw: bytes, content_type: str) -> tuple[int, Obj]:
        with self._store.lock:
            plan = self._plan(method, route, query, raw, content_type)
            obj = None if plan.obj is None else self._finalize(plan, plan.obj)
            name = (obj or plan.old or {}).get("metadata", {}).get("name", plan.name)
            stored = self._store.objects[plan.rt.key].get((plan.namespace or "", name))
            return plan.code, self._commit(plan, obj, stored, bool(query.get("dryRun")))

    def _plan(self, method: str, route: _Route, query: dict[str, str], raw: bytes, content_type: str) -> _Write:
        """What the request would write, from the stored objects (call with the lock held)."""
        rt, ns, name, sub = route.rt, route.namespace, route.name, route.subresource
        if method == "POST":
            obj = self._new_object(rt, ns, _parse_json(raw, dict))
            return _Write("CREATE", rt, ns, obj["metadata"].get("name") or "", obj, None, 201)
        assert name is not None
        if method == "DELETE":
            options = _parse_json(raw, dict) if raw.strip() else {}
            current = self._get(rt, ns, name)
            pre = options.get("preconditions") or {}
            if pre.get("uid") and pre["uid"] != current["metadata"]["uid"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rt.kind} "{name}": the UID in the precondition '
                               f"({pre['uid']}) does not match the UID in record ({current['metadata']['uid']}). The object "
                               "might have been deleted and then recreated", _details(name, rt.group, rt.kind))
            return _Write("DELETE", rt, ns, name, None, current, 200)
        if method == "PUT":
            current = self._get(rt, ns, name)
            new = self._updated_object(rt, ns, name, _parse_json(raw, dict), current, sub)
            return _Write("UPDATE", rt, ns, name, new, current, 200, sub)
        ctype = content_type.split(";")[0].strip().lower()
        # A strategic merge patch is served as a JSON merge patch: the list merge keys are not modelled.
        accepted = ["application/json-patch+json", "application/merge-patch+json", "application/strategic-merge-patch+json",
                    "application/apply-patch+yaml"]
        if ctype not in accepted:
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: " + ", ".join(accepted))
        patch: Any = None
        if ctype == "application/apply-patch+yaml":
            if not query.get("fieldManager"):
                raise _bad_request("fieldManager is required for apply requests")
            try:
                patch = yaml.safe_load(raw.decode() or "{}")
            except yaml.YAMLError as exc:
                raise _bad_request(f"error decoding YAML: {exc}") from None
            if not isinstance(patch, dict):
                raise _bad_request("the apply configuration must be an object")
            if (ns or "", name) not in self._store.objects[rt.key] and not sub:
                patch.setdefault("metadata", {}).setdefault("name", name)
                obj = self._new_object(rt, ns, patch)
                return _Write("CREATE", rt, ns, name, obj, None, 201)
        current = self._get(rt, ns, name)
        if ctype == "application/json-patch+json":
            ops = _parse_json(raw, list)
            try:
                result = jsonpatch.apply_patch(current, ops)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {exc}") from None
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            result = json_merge_patch(current, _parse_json(raw, dict))
        else:
            result = json_merge_patch(current, patch)
        if not isinstance(result, dict):
            raise _bad_request("the patch did not produce an object")
        # a metadata.resourceVersion left in the result is a precondition, checked by _updated_object
        new = self._updated_object(rt, ns, name, result, current, sub)
        return _Write("UPDATE", rt, ns, name, new, current, 200, sub)

    def _new_object(self, rt: ResourceType, ns: str | None, body: Obj) -> Obj:
        """A create's object: type, namespace and preconditions checked, the fields only the server
        sets removed (the name is generated by :meth:`_finalize`)."""
        obj = copy.deepcopy(body)
        self._check_type(rt, obj)
        self._check_namespace(rt, obj, ns)
        meta = obj["metadata"]
        try:
            if int(meta.get("resourceVersion") or 0) != 0:
                raise ApiError(500, None, "resourceVersion should not be set on objects to be created")
        except ValueError:
            pass
        if not meta.get("name") and not meta.get("generateName"):
            raise _invalid(rt, "", [("metadata.name", "Required value: name or generateName is required", "FieldValueRequired")])
        for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields", "uid",
                  "creationTimestamp"):
            meta.pop(k, None)
        return obj

    def _updated_object(self, rt: ResourceType, ns: str | None, name: str, body: Obj, current: Obj, subresource: str) -> Obj:
        """An update's object; a status subresource write changes only ``status``,
        a main-resource write of a kind with one changes everything but ``status``."""
        obj = copy.deepcopy(body)
        self._check_type(rt, obj)
        self._check_namespace(rt, obj, ns)
        meta, cur_meta = obj["metadata"], current["metadata"]
        if meta.get("name") not in (None, "", name):
            raise _bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        meta["name"] = name
        if meta.get("resourceVersion") and meta["resourceVersion"] != cur_meta["resourceVersion"]:
            raise _conflict(rt, name, _STALE)
        for k in ("uid", "creationTimestamp"):
            if k in cur_meta:
                meta[k] = cur_meta[k]
            else:
                meta.pop(k, None)
        meta["resourceVersion"] = cur_meta["resourceVersion"]
        if subresource == "status":
            status = obj.get("status")
            obj = copy.deepcopy(current)
            obj.pop("status", None)
            if status is not None:
                obj["status"] = status
        elif rt.status:
            obj.pop("status", None)
            if "status" in current:
                obj["status"] = copy.deepcopy(current["status"])
        return obj

    def _finalize(self, plan: _Write, obj: Obj) -> Obj:
        """What the storage layer does before it stores (lock held): a create's generated name, uid and time; defaults again (a patch is a request); validation."""
        obj = copy.deepcopy(obj)
        if not isinstance(obj.get("metadata"), dict):
            raise _bad_request("metadata must be an object")
        self._check_type(plan.rt, obj)
        self._check_namespace(plan.rt, obj, plan.namespace)
        meta = obj["metadata"]
        if plan.operation == "CREATE":
            if not meta.get("name") and meta.get("generateName"):
                alphabet = "bcdfghjklmnpqrstvwxz2456789"
                meta["name"] = meta["generateName"] + "".join(random.choice(alphabet) for _ in range(5))
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            _reset_status_on_create(plan.rt, obj)
        elif plan.old is not None:
            meta["name"] = plan.old["metadata"]["name"]
            for k in ("uid", "creationTimestamp", "resourceVersion"):
                if k in plan.old["metadata"]:
                    meta[k] = plan.old["metadata"][k]
        _apply_defaults(self._store, plan.rt, obj)
        _drop_empty_meta(obj)
        _validate(plan.rt, obj)
        return obj

    def _commit(self, plan: _Write, obj: Obj | None, stored: Obj | None, dry_run: bool) -> Obj:
        """Store the admitted write (call with the lock held); a dry run and a no-op update store nothing."""
        rt = plan.rt
        if plan.operation == "DELETE":
            assert plan.old is not None
            if not dry_run:
                self._store.remove(rt, plan.old)
            return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {**_details(plan.name, rt.group, rt.plural), "uid": plan.old["metadata"]["uid"]}}
        assert obj is not None
        name = obj["metadata"]["name"]
        if plan.operation == "CREATE":
            if stored is not None:
                raise ApiError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(name, rt.group, rt.plural))
            if dry_run:
                return self._present(rt, copy.deepcopy(obj))
            return self._present(rt, self._store.commit(rt, "ADDED", obj, None))
        assert stored is not None
        if dry_run or _without_rv(obj) == _without_rv(stored):
            return self._present(rt, copy.deepcopy(obj))  # a no-op write is not a write: same resourceVersion, no event
        return self._present(rt, self._store.commit(rt, "MODIFIED", obj, stored))

    # -- watch ------------------------------------------------------------------

    def _watch(self, h: _Handler, route: _Route, query: dict[str, str]) -> None:
        """Stream watch events until timeout, close_watches(), stop() or the client leaves."""
        rt = route.rt
        flt = _Filter(route.namespace, parse_label_selector(query.get("labelSelector")), route.name or _named(query))
        rv_param = query.get("resourceVersion") or ""
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        timeout = float(query.get("timeoutSeconds") or self.watch_timeout)
        if rv_param and not rv_param.isdigit():
            raise _bad_request(f"invalid resource version: {rv_param}")
        store = self._store
        error: Obj | None = None
        initial: list[Obj] = []
        with store.cond:
            epoch = store.epoch
            if rv_param in ("", "0"):
                objs = store.objects[rt.key]
                initial = [self._present(rt, copy.deepcopy(objs[k])) for k in sorted(objs) if flt.matches(objs[k])]
                cursor = store.rv
            else:
                cursor = int(rv_param)
                if cursor < store.floor:
                    error = status_object(410, "Expired", f"too old resource version: {cursor} ({store.floor})")
            self._open_watches += 1
            store.cond.notify_all()
        try:
            h.start_stream()
            if error:
                h.write_event({"type": "ERROR", "object": error})
                return
            for obj in initial:
                h.write_event({"type": "ADDED", "object": obj})
            self._stream(h, rt, flt, cursor, epoch, timeout, bookmarks)
        except OSError:
            pass
        finally:
            h.end_stream()
            with store.cond:
                self._open_watches -= 1
                store.cond.notify_all()

    def _stream(self, h: _Handler, rt: ResourceType, flt: _Filter, cursor: int, epoch: int,
                timeout: float, bookmarks: bool) -> None:
        store = self._store
        start = time.monotonic()
        deadline = start + timeout
        next_bookmark = start + self.bookmark_interval
        last_forced = self._bookmark_now
        while True:
            with store.cond:
                while True:
                    now = time.monotonic()
                    if self._stopping or store.epoch != epoch or cursor < store.floor:
                        return  # closed, stopped, or fell out of the history (the client re-watches)
                    events = store.events_after(cursor)
                    forced = self._bookmark_now != last_forced
                    if events or now >= deadline or forced or (bookmarks and now >= next_bookmark):
                        break
                    store.cond.wait(min(0.25, deadline - now))
                    if h.client_gone():
                        return
                last_forced = self._bookmark_now
            for ev in events:
                cursor = ev.rv
                if ev.resource != rt.key:
                    continue
                kind = self._translate(ev, flt)
                if kind:
                    h.write_event({"type": kind, "object": self._present(rt, copy.deepcopy(ev.object))})
            now = time.monotonic()
            if bookmarks and (forced or now >= next_bookmark or now >= deadline):
                h.write_event(self._bookmark(rt, cursor))
                next_bookmark = now + self.bookmark_interval
            if now >= deadline:
                return

    @staticmethod
    def _translate(ev: WatchEvent, flt: _Filter) -> str | None:
        """The event type this watcher sees: selectors turn MODIFIED into ADDED/DELETED."""
        new_ok = flt.matches(ev.object)
        if ev.type != "MODIFIED":
            return ev.type if new_ok else None
        old_ok = ev.old is not None and flt.matches(ev.old)
        if new_ok:
            return "MODIFIED" if old_ok else "ADDED"
        return "DELETED" if old_ok else None

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int) -> Obj:
        meta: Obj = {"resourceVersion": str(rv), "creationTimestamp": None}
        return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}}


def _parse_json(raw: bytes, expected: type) -> Any:
    try:
        value = json.loads(raw or b"null")
    except ValueError as exc:
        raise _bad_request(f"error decoding request body: {exc}") from None
    if not isinstance(value, expected):
        raise _bad_request(f"the request body must be a JSON {'object' if expected is dict else 'array'}")
    return value
