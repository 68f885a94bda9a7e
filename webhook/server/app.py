"""The webhook's ASGI application: ``/mutate``, ``/validate``, ``/healthz``, ``/readyz``, ``/metrics``.

HTTP concerns only — body size, JSON decoding, envelope validation, metrics and logs; decisions are
in :mod:`.handlers`. A body that is not an AdmissionReview gets HTTP 400 with a JSON error, one
over ``max_body_bytes`` gets 413; every AdmissionReview gets HTTP 200 with the decision inside, even
when our own code fails, so the API server shows the user a message instead of a bare error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Receive, Scope, Send

from volcano_job_webhook import __version__
from volcano_job_webhook.plugins import Chain

from .handlers import Handler, JobCache, JobValidator, PodMutator
from .jobs import JobSource
from .metrics import WebhookMetrics
from .review import AdmissionResponse, ReviewError, parse_review, review_response

log = logging.getLogger(__name__)

# Documented for clients and for schema-driven fuzzing; the endpoint parses the raw body itself, so
# a malformed review gets our 400 with a precise message rather than a generic validation error.
REVIEW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "request"],
    "properties": {
        "apiVersion": {"type": "string", "enum": ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]},
        "kind": {"type": "string", "enum": ["AdmissionReview"]},
        "request": {
            "type": "object",
            "required": ["uid", "kind", "operation"],
            "properties": {
                "uid": {"type": "string"},
                "kind": {"type": "object", "properties": {"group": {"type": "string"}, "version": {"type": "string"}, "kind": {"type": "string"}}},
                "resource": {"type": "object"},
                "operation": {"type": "string", "enum": ["CREATE", "UPDATE", "DELETE", "CONNECT"]},
                "namespace": {"type": "string"},
                "name": {"type": "string"},
                "object": {"type": "object"},
                "dryRun": {"type": "boolean"},
            },
        },
    },
}


class BodyTooLarge(Exception):
    pass


def _json_error(exc: orjson.JSONDecodeError) -> str:
    # Our own words, stable across JSON-library versions; orjson refuses nesting past 1024 levels.
    if "limit" in exc.msg:
        return "not JSON: nested more than 1024 levels deep"
    return f"not JSON: invalid at character {exc.pos}"


def _json(status: int, payload: Any) -> Response:
    return Response(content=orjson.dumps(payload), status_code=status, media_type="application/json")


async def _receive_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request body straight from ASGI ``receive``, refused past ``limit`` bytes."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise BodyTooLarge
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class AdmissionEndpoint:
    """One admission path over HTTP: a body in, an HTTP status and JSON body out.

    Over ``limit`` bytes: 413. Not an AdmissionReview: 400 with the reason. Every review gets 200
    with the handler's decision inside — a handler that fails answers a denial, so the API server
    shows the user a message rather than a bare error. Served as plain ASGI by
    :class:`WebhookServer`; ``summary`` is its line in the OpenAPI document.
    """

    def __init__(self, name: str, handler: Handler, metrics: WebhookMetrics, limit: int, summary: str = "") -> None:
        self.name = name
        self.handler = handler
        self.metrics = metrics
        self.limit = limit
        self.summary = summary or f"{name} (AdmissionReview)"

    def operation(self) -> dict[str, Any]:
        """This endpoint as an OpenAPI operation (``POST``)."""
        error = {"content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "string"}}}}}}
        return {
            "summary": self.summary,
            "operationId": self.name,
            "requestBody": {"required": True, "content": {"application/json": {"schema": REVIEW_SCHEMA}}},
            "responses": {
                "200": {"description": "The AdmissionReview, the decision in its response",
                        "content": {"application/json": {"schema": {"type": "object"}}}},
                "400": {"description": "Not an AdmissionReview", **error},
                "413": {"description": f"Body over {self.limit} bytes", **error},
            },
        }

    async def answer(self, body: bytes | None) -> tuple[int, bytes]:
        """HTTP status and JSON body for one request body; None means it was over the limit."""
        started = time.perf_counter()
        requests = self.metrics.requests
        if body is None:
            requests.labels(self.name, "too-large").inc()
            return 413, orjson.dumps({"error": f"body over the limit of {self.limit} bytes"})
        try:
            review = parse_review(orjson.loads(body))
        except (orjson.JSONDecodeError, ReviewError) as exc:
            requests.labels(self.name, "bad-request").inc()
            reason = _json_error(exc) if isinstance(exc, orjson.JSONDecodeError) else str(exc)
            return 400, orjson.dumps({"error": f"not an AdmissionReview: {reason}"})
        try:
            response = await self.handler(review)
        except RecursionError:  # the handlers bound depth first; this is the last line of defence
            response = AdmissionResponse.deny("request.object: nested too deeply to process", code=400, result="bad-request")
        except Exception:
            log.exception("admission handler failed", extra={"uid": review.uid})
            response = AdmissionResponse.deny("volcano-job-webhook: internal error; see the webhook's logs", code=500, result="error")
        requests.labels(self.name, response.result).inc()
        self.metrics.latency.labels(self.name).observe(time.perf_counter() - started)
        return 200, orjson.dumps(review_response(review, response))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body: bytes | None
        try:
            body = await _receive_body(scope, receive, self.limit)
        except BodyTooLarge:
            body = None
        except ConnectionError:
            return  # nobody is left to answer
        status, content = await self.answer(body)
        await send({"type": "http.response.start", "status": status, "headers": [_JSON_CONTENT_TYPE, (b"content-length", b"%d" % len(content))]})
        await send({"type": "http.response.body", "body": content})


_JSON_CONTENT_TYPE = (b"content-type", b"application/json")
_NOT_ALLOWED = orjson.dumps({"error": "method not allowed: POST an AdmissionReview"})


class WebhookServer:
    """The webhook's ASGI application: the admission endpoints, and FastAPI for the rest.

    Every Pod the API server creates waits on ``/mutate``; FastAPI's middleware, route matching and
    dependency solving would add a third to its cost (measured in process: 200 µs a pytorch Pod,
    260 µs through a FastAPI route). So the admission paths are ``endpoints`` only, each answered
    straight by its :class:`AdmissionEndpoint` (405 for a method other than ``POST``); everything
    else — health, metrics, lifespan and the OpenAPI document, which describes ``endpoints`` too —
    goes to ``api``, which has no route of its own for them.
    """

    def __init__(self, api: FastAPI, endpoints: MutableMapping[str, AdmissionEndpoint], metrics: WebhookMetrics | None = None) -> None:
        self.api = api
        self.endpoints = endpoints
        self.metrics = metrics or WebhookMetrics()
        api.openapi = _documenting(api.openapi, endpoints)  # type: ignore[method-assign]

    def lifespan(self) -> AbstractAsyncContextManager[Any]:
        """The app's lifespan (job source started, then stopped) without a server: for tests and tools."""
        return self.api.router.lifespan_context(self.api)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            endpoint = self.endpoints.get(scope["path"])
            if endpoint is not None:
                if scope["method"] == "POST":
                    await endpoint(scope, receive, send)
                else:
                    await send({"type": "http.response.start", "status": 405, "headers": [
                        _JSON_CONTENT_TYPE, (b"content-length", b"%d" % len(_NOT_ALLOWED)), (b"allow", b"POST")]})
                    await send({"type": "http.response.body", "body": _NOT_ALLOWED})
                return
        await self.api(scope, receive, send)


def _documenting(openapi: Callable[[], dict[str, Any]], endpoints: MutableMapping[str, AdmissionEndpoint]) -> Callable[[], dict[str, Any]]:
    """FastAPI's ``openapi()`` (which makes the document once and keeps it) with ``endpoints`` added."""

    def document() -> dict[str, Any]:
        schema = openapi()
        for path, endpoint in endpoints.items():
            schema["paths"].setdefault(path, {"post": endpoint.operation()})
        return schema

    return document


def create_app(
    source: JobSource, chain: Chain | None = None, *, max_body_bytes: int = 3 * 1024 * 1024, audit: bool = False,
) -> WebhookServer:
    """The webhook over ``source``; it starts and stops ``source`` with its lifespan.
    ``audit`` allows, with a warning, what would be denied."""
    chain = chain or Chain()
    jobs = JobCache(chain)
    metrics = WebhookMetrics(cached_jobs=lambda: len(source))
    mutate = AdmissionEndpoint("mutate", PodMutator(source, jobs, metrics, audit=audit), metrics, max_body_bytes,
                               "Wire a Pod of a Volcano job (AdmissionReview)")
    validate = AdmissionEndpoint("validate", JobValidator(chain, audit=audit), metrics, max_body_bytes,
                                 "Check a Volcano Job's plugins (AdmissionReview)")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        source.start()
        try:
            yield
        finally:
            source.stop()

    api = FastAPI(title="volcano-job-webhook", version=__version__, lifespan=lifespan)

    @api.get("/healthz", summary="The process is up")
    async def healthz() -> Response:
        return _json(200, {"status": "ok"})

    @api.get("/readyz", summary="The job source has synced")
    async def readyz() -> Response:
        if source.ready:
            return _json(200, {"status": "ready", "jobs": len(source), **source.status()})
        return _json(503, {"status": "not ready", "reason": "job source has not synced", **source.status()})

    @api.get("/metrics", summary="Prometheus metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return WebhookServer(api, {"/mutate": mutate, "/validate": validate}, metrics)
