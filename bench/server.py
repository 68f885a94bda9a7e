"""The benchmark's server: the real ``serve`` app plus two endpoints that parse the AdmissionReview
and answer allowed with no patch: ``/baseline`` as a FastAPI route (the issue's baseline, every
figure's ratio is to it) and ``/floor`` through the same plain-ASGI path as ``/mutate`` (what
``/mutate`` costs beyond parsing and answering).

Run as ``python bench/server.py JOBS_DIR CERTS_DIR PORT``; it is pinned to one core by the caller.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
from fastapi import Request
from fastapi.responses import Response

from volcano_job_webhook import logs
from volcano_job_webhook.certs import ensure_certs
from volcano_job_webhook.config import load_settings
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.server.app import AdmissionEndpoint, create_app
from volcano_job_webhook.server.https import serve
from volcano_job_webhook.server.jobs import DirectoryJobSource
from volcano_job_webhook.server.review import AdmissionRequest, AdmissionResponse, parse_review, review_response
from volcano_job_webhook.server.run import connection_limits, server_options


def main() -> None:
    jobs_dir, certs_dir, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    logs.configure("info")  # serve's default level, as in production
    app = create_app(DirectoryJobSource(jobs_dir), Chain())

    @app.api.post("/baseline")
    async def baseline(request: Request) -> Response:
        review = parse_review(orjson.loads(await request.body()))
        return Response(orjson.dumps(review_response(review, AdmissionResponse.allow())), media_type="application/json")

    async def allow(review: AdmissionRequest) -> AdmissionResponse:
        return AdmissionResponse.allow()

    app.endpoints["/floor"] = AdmissionEndpoint("floor", allow, app.endpoints["/mutate"].metrics, 3 * 1024 * 1024)
    paths = ensure_certs(certs_dir, "volcano-job-webhook", "volcano-job-webhook")
    # serve's connection limits at their defaults, as in production (guarded listener and protocol).
    _, options = server_options(connection_limits(load_settings()))
    serve(app, "127.0.0.1", port, paths.cert, paths.key, **options)


if __name__ == "__main__":
    main()
