"""The webhook's FastAPI app: ``POST /mutate`` and ``/validate`` (AdmissionReviews, their schema
from :mod:`.admission`'s models), ``/healthz``, ``/readyz``, ``/metrics``. HTTP concerns only; the
decisions are :mod:`.handlers`'."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from volcano_job_webhook import __version__
from volcano_job_webhook.plugins import Chain

from .admission import AdmissionResponse, AdmissionReview, ReviewError, read_review, review_response
from .handlers import Handler, JobCache, JobValidator, PodMutator
from .jobs import JobSource
from .metrics import WebhookMetrics

log = logging.getLogger(__name__)


class Problem(BaseModel):
    error: str


def _json(status: int, payload: Any) -> Response:
    return Response(content=orjson.dumps(payload), status_code=status, media_type="application/json")


async def _body(request: Request, limit: int) -> bytes | None:
    """The request body, or None past ``limit`` bytes (declared, or as it streams in)."""
    for name, value in request.scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            return None
    chunks, size = [], 0
    async for chunk in request.stream():  # ClientDisconnect when the client goes
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


Endpoint = Callable[[Request], Coroutine[Any, Any, Response]]


class AdmissionRoute(APIRoute):
    """A FastAPI route (its router, middleware and OpenAPI document) whose POST goes straight to the
    endpoint, without the dependency solving and exit stacks it has no use for: bench/run.py's
    /mutate ≥ 0.70 × the FastAPI baseline at 16 connections."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await super().handle(scope, receive, send)  # the framework's 405
            return
        response = await self.endpoint(Request(scope, receive))
        await response(scope, receive, send)


def admission_endpoint(name: str, handler: Handler, metrics: WebhookMetrics, limit: int) -> Endpoint:
    """The endpoint of one admission path: 413 past ``limit`` bytes, 400 for a body that is not an
    AdmissionReview, else 200 with the decision inside, a failing handler's as a denial, so the API
    server shows the user a message rather than a bare error."""
    requests, latency = metrics.requests, metrics.latency.labels(name)

    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        try:
            body = await _body(request, limit)
        except ClientDisconnect:  # nobody is left to answer
            return Response(status_code=400)
        if body is None:
            requests.labels(name, "too-large").inc()
            return _json(413, {"error": f"body over the limit of {limit} bytes"})
        try:
            review = read_review(body)
        except ReviewError as exc:
            requests.labels(name, "bad-request").inc()
            return _json(400, {"error": f"not an AdmissionReview: {exc}"})
        admission = review.request
        assert admission is not None  # read_review refuses a review without one
        try:
            response = await handler(admission)
        except RecursionError:  # the handlers bound depth first; this is the last line of defence
            response = AdmissionResponse.deny("request.object: nested too deeply to process", code=400, result="bad-request")
        except Exception:
            log.exception("admission handler failed", extra={"uid": admission.uid})
            response = AdmissionResponse.deny("volcano-job-webhook: internal error; see the webhook's logs", code=500, result="error")
        requests.labels(name, response.result).inc()
        latency.observe(time.perf_counter() - started)
        return Response(orjson.dumps(review_response(review, response)), media_type="application/json")

    return endpoint


def create_app(
    source: JobSource, chain: Chain | None = None, *, max_body_bytes: int = 3 * 1024 * 1024, audit: bool = False,
) -> FastAPI:
    """The webhook over ``source``, which it starts and stops with its lifespan; its metrics are
    ``app.state.metrics``. ``audit`` allows, with a warning, what would be denied."""
    chain = chain or Chain()
    metrics = WebhookMetrics(cached_jobs=lambda: len(source))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        source.start()
        try:
            yield
        finally:
            source.stop()

    # No Swagger UI or ReDoc: /openapi.json is the document, and every route is matched in turn. No
    # OpenTelemetry: /metrics is the telemetry, and FastAPI asks three global providers every request.
    api = FastAPI(title="volcano-job-webhook", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    api.state.metrics = metrics
    # The body is read by read_review, not by FastAPI: the model documents it, the response's model holds it.
    review_body = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": "#/components/schemas/AdmissionReview"}}}}}
    problems: dict[int | str, dict[str, Any]] = {
        400: {"model": Problem, "description": "Not an AdmissionReview"},
        413: {"model": Problem, "description": f"Body over {max_body_bytes} bytes"}}
    for name, summary, handler in (
        ("mutate", "Wire a Pod of a Volcano job", PodMutator(source, JobCache(chain), metrics, audit=audit)),
        ("validate", "Check a Volcano Job's plugins", JobValidator(chain, audit=audit)),
    ):
        api.router.add_api_route(f"/{name}", admission_endpoint(name, handler, metrics, max_body_bytes), methods=["POST"],
                                 name=name, summary=summary, response_model=AdmissionReview, responses=problems,
                                 openapi_extra=review_body, route_class_override=AdmissionRoute)

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

    return api
