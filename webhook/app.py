"""The FastAPI application: ``/mutate``, ``/validate``, ``/healthz``, ``/readyz``, ``/metrics``.

HTTP concerns only — body size, JSON decoding, envelope validation, metrics and logs; decisions are
in :mod:`webhook.handlers`. A body that is not an AdmissionReview gets HTTP 400 with a JSON error, one
over ``max_body_bytes`` gets 413; every AdmissionReview gets HTTP 200 with the decision inside, even
when our own code fails, so the API server shows the user a message instead of a bare error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from volcano_job_webhook.plugins import Chain

from .admission import AdmissionRequest, AdmissionResponse, ReviewError, parse_review, review_response
from .handlers import JobCache, mutate_pod, validate_job
from .jobsource import JobSource
from .metrics import WebhookMetrics

log = logging.getLogger(__name__)

Decide = Callable[[AdmissionRequest], Awaitable[AdmissionResponse]]

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


_JSON_HEADERS = [(b"content-type", b"application/json")]


class AdmissionFastPath:
    """``POST /mutate`` and ``POST /validate`` as plain ASGI, ahead of FastAPI's routing.

    Every Pod the API server creates waits on ``/mutate``; FastAPI's middleware, route matching
    and dependency solving cost as much as parsing the review and answering it, about half of a
    plain admission on one core. Both paths run the same ``answer`` function, so the answers are
    byte for byte the ones the documented FastAPI routes give; anything else goes on to FastAPI.
    """

    def __init__(self, app: ASGIApp, endpoints: Mapping[str, Callable[[bytes | None], Awaitable[tuple[int, bytes]]]], limit: int) -> None:
        self.app = app
        self.endpoints = endpoints
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.endpoints.get(scope.get("path", "")) if scope["type"] == "http" and scope.get("method") == "POST" else None
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        try:
            body: bytes | None = await _receive_body(scope, receive, self.limit)
        except BodyTooLarge:
            body = None
        except ConnectionError:
            return  # nobody is left to answer
        status, content = await endpoint(body)
        await send({"type": "http.response.start", "status": status, "headers": _JSON_HEADERS + [(b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})


class WebhookApp(FastAPI):
    """FastAPI with :class:`AdmissionFastPath` outermost, ahead of FastAPI's own middleware too
    (error pages, telemetry, body limits: the fast path answers every failure of a review itself)."""

    admission_endpoints: dict[str, Callable[[bytes | None], Awaitable[tuple[int, bytes]]]] | None = None
    admission_body_limit: int = 0

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        if not self.admission_endpoints:
            return stack
        return AdmissionFastPath(stack, self.admission_endpoints, self.admission_body_limit)


def create_app(
    source: JobSource, chain: Chain | None = None, *, max_body_bytes: int = 3 * 1024 * 1024, fast_path: bool = True
) -> FastAPI:
    """The webhook app over ``source``. The app starts and stops ``source`` with its lifespan.
    ``fast_path=False`` leaves the admission endpoints to FastAPI's routing (same answers, slower)."""
    chain = chain or Chain()
    metrics = WebhookMetrics(cached_jobs=lambda: len(source))
    jobs = JobCache()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        source.start()
        try:
            yield
        finally:
            source.stop()

    app = WebhookApp(title="volcano-job-webhook", version="0.1.0", lifespan=lifespan)
    app.state.metrics = metrics
    app.state.source = source
    app.state.chain = chain

    async def answer(body: bytes | None, endpoint: str, decide: Decide) -> tuple[int, bytes]:
        """HTTP status and JSON body for one review; ``body`` None means it was over the limit."""
        started = time.perf_counter()
        if body is None:
            metrics.requests.labels(endpoint, "too-large").inc()
            return 413, orjson.dumps({"error": f"body over the limit of {max_body_bytes} bytes"})
        try:
            review = parse_review(orjson.loads(body))
        except (orjson.JSONDecodeError, ReviewError) as exc:
            metrics.requests.labels(endpoint, "bad-request").inc()
            reason = _json_error(exc) if isinstance(exc, orjson.JSONDecodeError) else str(exc)
            return 400, orjson.dumps({"error": f"not an AdmissionReview: {reason}"})
        try:
            response = await decide(review)
        except Exception:
            log.exception("admission handler failed", extra={"uid": review.uid})
            response = AdmissionResponse.deny("volcano-job-webhook: internal error; see the webhook's logs", code=500, result="error")
        metrics.requests.labels(endpoint, response.result).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
        return 200, orjson.dumps(review_response(review, response))

    async def mutate_body(body: bytes | None) -> tuple[int, bytes]:
        return await answer(body, "mutate", lambda review: mutate_pod(review, source, chain, metrics, jobs))

    async def validate_body(body: bytes | None) -> tuple[int, bytes]:
        return await answer(body, "validate", lambda review: validate_job(review, chain))

    async def through_fastapi(request: Request, handle: Callable[[bytes | None], Awaitable[tuple[int, bytes]]]) -> Response:
        try:
            body: bytes | None = await _receive_body(request.scope, request.receive, max_body_bytes)
        except BodyTooLarge:
            body = None
        status, content = await handle(body)
        return Response(content=content, status_code=status, media_type="application/json")

    # Served by AdmissionFastPath unless it is off; declared here for the OpenAPI document too.
    @app.post("/mutate", openapi_extra=_REVIEW_BODY, summary="Wire a Pod of a Volcano job (AdmissionReview)")
    async def mutate(request: Request) -> Response:
        return await through_fastapi(request, mutate_body)

    @app.post("/validate", openapi_extra=_REVIEW_BODY, summary="Check a Volcano Job's plugins (AdmissionReview)")
    async def validate(request: Request) -> Response:
        return await through_fastapi(request, validate_body)

    if fast_path:
        app.admission_endpoints = {"/mutate": mutate_body, "/validate": validate_body}
        app.admission_body_limit = max_body_bytes

    @app.get("/healthz", summary="The process is up")
    async def healthz() -> Response:
        return _json(200, {"status": "ok"})

    @app.get("/readyz", summary="The job source has synced")
    async def readyz() -> Response:
        if source.ready:
            return _json(200, {"status": "ready", "jobs": len(source), **source.status()})
        return _json(503, {"status": "not ready", "reason": "job source has not synced", **source.status()})

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
