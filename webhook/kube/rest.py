"""The one way this package makes a client (:func:`api_client`) and talks to the API server: plain-JSON
calls, server-side apply and cancellable watches through the official client's ``ApiClient.call_api``,
below its generated methods, which cost more CPU per request (docs/benchmarks.md); tests/double/test_kube_client.py
checks what this relies on."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from volcano_job_webhook.plugins.kinds import Kind

APPLY_PATCH = "application/apply-patch+yaml"
Query = Sequence[tuple[str, str]]


def api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """A client for the cluster: the given kubeconfig, else in-cluster config, else ``$KUBECONFIG`` or
    ``~/.kube/config``; where there is none, ``ConfigException`` with one line saying what was tried."""
    if kubeconfig is not None:
        if not kubeconfig.is_file():
            raise config.ConfigException(f"kubeconfig {kubeconfig} does not exist")
        return _from_kubeconfig(kubeconfig)
    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except config.ConfigException as in_cluster:
        outside = in_cluster
    try:
        return _from_kubeconfig(None)
    except config.ConfigException as exc:
        # The client's own words for a file that is simply absent ("Invalid kube-config file. No
        # configuration found.") send people looking for a broken file: say what was looked for.
        if "No configuration found" not in str(exc):
            raise
        where = os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise config.ConfigException(
            f"no cluster to connect to: not in a Pod ({str(outside).rstrip('.')}) and no kubeconfig at {where}"
            " (give --kubeconfig or set KUBECONFIG)") from None


def _from_kubeconfig(path: Path | None) -> client.ApiClient:
    try:
        return config.new_client_from_config(config_file=str(path) if path else None)
    except yaml.YAMLError as exc:
        where = path or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise config.ConfigException(f"kubeconfig {where} is not YAML: {str(exc).splitlines()[0]}") from None


def _path(resource: Kind, namespace: str | None, name: str | None = None) -> str:
    # Each name one path segment, as the generated methods quote theirs: a name that is not one yet
    # (a Pod's label, before validation) cannot reach another path.
    return resource.path(namespace and quote(namespace, safe=""), name and quote(name, safe=""))


def widen_pool(api: client.ApiClient, size: int) -> None:
    """Let ``api`` keep at least ``size`` connections open (a watch holds one for life, a worker one a
    call): past its pool urllib3 opens and drops a connection per request, warning each time."""
    configuration = api.configuration
    if (configuration.connection_pool_maxsize or 0) >= size:
        return
    configuration.connection_pool_maxsize = size
    # The pool's size is read once, when the REST client is made: a client made afresh, as ApiClient does.
    old = api.rest_client
    api.rest_client = type(old)(configuration)
    old.close()


class Rest:
    """One ApiClient's calls, each returning the decoded JSON answer or raising ``ApiException``; the
    client sends each request as built here (URL, headers, the token its own hook refreshes)."""

    # How long a bearer token from the client's refresh hook is reused: the loaders' hooks rebuild the
    # configuration on every call (docs/benchmarks.md); tokens live for minutes.
    AUTH_TTL = 1.0

    def __init__(self, api: client.ApiClient, timeout: float = 30.0) -> None:
        self.api = api
        self.timeout = timeout
        self.host = api.configuration.host  # a property that re-reads the proxy environment
        self._auth: tuple[float, str | None] = (-self.AUTH_TTL, None)

    def _authorization(self) -> str | None:
        read_at, value = self._auth
        now = time.monotonic()
        if now - read_at >= self.AUTH_TTL:
            bearer = self.api.configuration.auth_settings().get("BearerToken") or {}
            value = bearer.get("value") or None
            self._auth = (now, value)
        return value

    def _headers(self, content_type: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "Content-Type": content_type, **self.api.default_headers}
        authorization = self._authorization()
        if authorization:
            headers["Authorization"] = authorization
        if self.api.cookie:
            headers["Cookie"] = self.api.cookie
        return headers

    def _open(self, method: str, path: str, query: Query, body: Any, content_type: str,
              timeout: float | tuple[float, float]) -> urllib3.BaseHTTPResponse:
        """The answer, its body not yet read (a watch streams it); ``ApiException`` for a status outside 2xx."""
        url = self.host + path + (f"?{urlencode(list(query))}" if query else "")
        response = self.api.call_api(method, url, header_params=self._headers(content_type), body=body, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        answer: urllib3.BaseHTTPResponse = response.response
        return answer

    def call(self, method: str, path: str, *, query: Query = (), body: Any = None,
             content_type: str = "application/json", timeout: float | None = None) -> Any:
        response = self._open(method, path, query, body, content_type, timeout or self.timeout)
        return orjson.loads(response.data)

    def get(self, resource: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        return self._unless_gone("GET", _path(resource, namespace, name))

    def _unless_gone(self, method: str, path: str, body: Any = None) -> Any:
        """The answer, or None for a 404 (an object not there, or already gone)."""
        try:
            return self.call(method, path, body=body)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def apply(self, resource: Kind, obj: dict[str, Any], field_manager: str) -> dict[str, Any]:
        """Server-side apply of ``obj`` as ``field_manager``, forced: created when missing, then exactly
        what ``obj`` says of the fields this manager owns (those it leaves out now are removed)."""
        meta = obj["metadata"]
        return self.call("PATCH", _path(resource, meta.get("namespace"), meta["name"]), body=obj, content_type=APPLY_PATCH,
                         query=[("fieldManager", field_manager), ("force", "true")])

    def delete(self, resource: Kind, namespace: str, name: str, uid: str | None = None) -> dict[str, Any] | None:
        """Delete; the answer (the object, terminating, while a finalizer holds it), or None when it was
        already gone. ``uid`` guards against deleting a re-created object."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        return self._unless_gone("DELETE", _path(resource, namespace, name), body)

    def create(self, resource: Kind, namespace: str, obj: dict[str, Any], field_manager: str | None = None) -> dict[str, Any]:
        """POST: 409 AlreadyExists when an object of that name is there, whoever made it."""
        query = [("fieldManager", field_manager)] if field_manager else []
        return self.call("POST", _path(resource, namespace), body=obj, query=query)

    def replace(self, resource: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT ``obj`` whole: 409 Conflict when its ``metadata.resourceVersion`` is no longer the stored one."""
        meta = obj["metadata"]
        return self.call("PUT", _path(resource, meta.get("namespace"), meta["name"]), body=obj)

    def json_patch(self, resource: Kind, namespace: str, name: str, operations: list[dict[str, Any]]) -> dict[str, Any]:
        """RFC 6902 JSON patch: all ``operations`` or none (a failed ``test`` refuses the lot with 422)."""
        return self.call("PATCH", _path(resource, namespace, name), body=operations, content_type="application/json-patch+json")

    def merge_patch(self, resource: Kind, namespace: str, name: str, patch: dict[str, Any], field_manager: str) -> dict[str, Any]:
        """RFC 7386 JSON merge patch (``null`` removes a field)."""
        return self.call("PATCH", _path(resource, namespace, name), body=patch, content_type="application/merge-patch+json",
                         query=[("fieldManager", field_manager)])

    def watch(self, path: str, query: Query, timeout: float) -> Stream:
        """A watch answer, read event by event; :meth:`Stream.cancel` ends it from another thread."""
        return Stream(self._open("GET", path, [*query, ("watch", "true")], None, "application/json", (10.0, timeout)))


class Stream:
    """The newline-delimited JSON events of one watch answer."""

    def __init__(self, response: urllib3.BaseHTTPResponse) -> None:
        self.response = response
        self._lock = threading.Lock()
        self.cancelled = False

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            for line in self.response:  # urllib3's own line split of what it streams, as it comes
                if line.strip():
                    yield orjson.loads(line)
        except Exception:
            if not self.cancelled:
                raise
        finally:
            self.close()

    def cancel(self) -> None:
        """End the stream now: shutting the socket down wakes a reader blocked in ``recv`` (closing
        it alone does not, so a watch would otherwise run until its next event or timeout)."""
        with self._lock:
            self.cancelled = True
            connection = getattr(self.response, "connection", None)
            sock = getattr(connection, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock, contextlib.suppress(Exception):
            self.response.close()
            # Give the pool its slot back (the closed connection is replaced on next use).
            self.response.release_conn()
