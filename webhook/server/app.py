"""The webhook's ASGI application: ``/mutate``, ``/validate``, ``/healthz``, ``/readyz``, ``/metrics``.

HTTP concerns only — body size, JSON decoding, envelope validation, metrics and logs; decisions are
in :mod:`.handlers`. A body that is not an AdmissionReview gets HTTP 400 with a JSON error, one
over ``max_body_bytes`` gets 413; every AdmissionReview gets HTTP 200 with the decision inside, even
when our own code fails, so the API server shows the user a message instead of a bare error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, MutableMapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
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

# Documented for clients and for schema-driven fuzzing; the handler parses the raw body itself, so
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
_REVIEW_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": REVIEW_SCHEMA}}}}


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
    :class:`WebhookServer`, and through FastAPI's documented route with the same bytes.
    """

    def __init__(self, name: str, handler: Handler, metrics: WebhookMetrics, limit: int) -> None:
        self.name = name
        self.handler = handler
        self.metrics = metrics
        self.limit = limit

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

    async def read(self, scope: Scope, receive: Receive) -> bytes | None:
        """The request body, or None when it is over the limit; ConnectionError if the client left."""
        try:
            return await _receive_body(scope, receive, self.limit)
        except BodyTooLarge:
            return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await self.read(scope, receive)
        except ConnectionError:
            return  # nobody is left to answer
        status, content = await self.answer(body)
        await send({"type": "http.response.start", "status": status, "headers": [_JSON_CONTENT_TYPE, (b"content-length", b"%d" % len(content))]})
        await send({"type": "http.response.body", "body": content})


_JSON_CONTENT_TYPE = (b"content-type", b"application/json")


class WebhookServer:
    """The webhook's ASGI application: FastAPI, with the admission endpoints answered ahead of it.

    Every Pod the API server creates waits on ``/mutate``; FastAPI's middleware, route matching and
    dependency solving cost as much as parsing the review and answering it. A ``POST`` to a path in
    ``endpoints`` goes straight to its :class:`AdmissionEndpoint`; everything else — health,
    metrics, the OpenAPI document, lifespan — to ``api``, whose ``/mutate`` and ``/validate`` routes
    document the same endpoints and give the same bytes.
    """

    def __init__(self, api: FastAPI, endpoints: MutableMapping[str, AdmissionEndpoint], metrics: WebhookMetrics | None = None) -> None:
        self.api = api
        self.endpoints = endpoints
        self.metrics = metrics or WebhookMetrics()

    def lifespan(self) -> AbstractAsyncContextManager[Any]:
        """The app's lifespan (job source started, then stopped) without a server: for tests and tools."""
        return self.api.router.lifespan_context(self.api)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self.endpoints.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await self.api(scope, receive, send)


def create_app(
    source: JobSource, chain: Chain | None = None, *, max_body_bytes: int = 3 * 1024 * 1024, fast_path: bool = True,
    audit: bool = False,
) -> WebhookServer:
    """The webhook over ``source``; it starts and stops ``source`` with its lifespan.
    ``fast_path=False`` leaves the admission endpoints to FastAPI's routing (same answers, slower);
    ``audit`` allows, with a warning, what would be denied."""
    chain = chain or Chain()
    jobs = JobCache(chain)
    metrics = WebhookMetrics(cached_jobs=lambda: len(source))
    mutate = AdmissionEndpoint("mutate", PodMutator(source, jobs, metrics, audit=audit), metrics, max_body_bytes)
    validate = AdmissionEndpoint("validate", JobValidator(chain, audit=audit), metrics, max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        source.start()
        try:
            yield
        finally:
            source.stop()

    api = FastAPI(title="volcano-job-webhook", version=__version__, lifespan=lifespan)

    async def through_fastapi(request: Request, endpoint: AdmissionEndpoint) -> Response:
        status, content = await endpoint.answer(await endpoint.read(request.scope, request.receive))
        return Response(content=content, status_code=status, media_type="application/json")

    @api.post("/mutate", openapi_extra=_REVIEW_BODY, summary="Wire a Pod of a Volcano job (AdmissionReview)")
    async def mutate_route(request: Request) -> Response:
        return await through_fastapi(request, mutate)

    @api.post("/validate", openapi_extra=_REVIEW_BODY, summary="Check a Volcano Job's plugins (AdmissionReview)")
    async def validate_route(request: Request) -> Response:
        return await through_fastapi(request, validate)

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

    return WebhookServer(api, {"/mutate": mutate, "/validate": validate} if fast_path else {}, metrics)
