"""The FastAPI application: ``/mutate``, ``/validate``, ``/healthz``, ``/readyz``, ``/metrics``.

HTTP concerns only — body size, JSON decoding, envelope validation, metrics and logs; decisions are
in :mod:`webhook.handlers`. A body that is not an AdmissionReview gets HTTP 400 with a JSON error, one
over ``max_body_bytes`` gets 413; every AdmissionReview gets HTTP 200 with the decision inside, even
when our own code fails, so the API server shows the user a message instead of a bare error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from plugins import Chain

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


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(source: JobSource, chain: Chain | None = None, *, max_body_bytes: int = 3 * 1024 * 1024) -> FastAPI:
    """The webhook app over ``source``. The app starts and stops ``source`` with its lifespan."""
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

    app = FastAPI(title="volcano-job-webhook", version="0.1.0", lifespan=lifespan)
    app.state.metrics = metrics
    app.state.source = source
    app.state.chain = chain

    async def answer(request: Request, endpoint: str, decide: Decide) -> Response:
        started = time.perf_counter()
        try:
            body = await _read_body(request, max_body_bytes)
        except BodyTooLarge:
            metrics.requests.labels(endpoint, "too-large").inc()
            return _json(413, {"error": f"body over the limit of {max_body_bytes} bytes"})
        try:
            review = parse_review(orjson.loads(body))
        except (orjson.JSONDecodeError, ReviewError) as exc:
            metrics.requests.labels(endpoint, "bad-request").inc()
            reason = _json_error(exc) if isinstance(exc, orjson.JSONDecodeError) else str(exc)
            return _json(400, {"error": f"not an AdmissionReview: {reason}"})
        try:
            response = await decide(review)
        except Exception:
            log.exception("admission handler failed", extra={"uid": review.uid})
            response = AdmissionResponse.deny("volcano-job-webhook: internal error; see the webhook's logs", code=500, result="error")
        metrics.requests.labels(endpoint, response.result).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
        return _json(200, review_response(review, response))

    @app.post("/mutate", openapi_extra=_REVIEW_BODY, summary="Wire a Pod of a Volcano job (AdmissionReview)")
    async def mutate(request: Request) -> Response:
        return await answer(request, "mutate", lambda review: mutate_pod(review, source, chain, metrics, jobs))

    @app.post("/validate", openapi_extra=_REVIEW_BODY, summary="Check a Volcano Job's plugins (AdmissionReview)")
    async def validate(request: Request) -> Response:
        return await answer(request, "validate", lambda review: validate_job(review, chain))

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
