"""The benchmark's server: the real ``serve`` app plus ``/baseline``, a FastAPI route that parses the
AdmissionReview and answers allowed with no patch (every figure's ratio is to it).

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
from volcano_job_webhook.certs.reload import CertReloader
from volcano_job_webhook.config import load_settings
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.server.admission import AdmissionResponse, read_review, review_response
from volcano_job_webhook.server.app import create_app
from volcano_job_webhook.server.https import build_server
from volcano_job_webhook.server.jobs import DirectoryJobSource
from volcano_job_webhook.server.run import connection_limits


def main() -> None:
    jobs_dir, certs_dir, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    logs.configure("info")  # serve's default level, as in production
    app = create_app(DirectoryJobSource(jobs_dir), Chain())

    @app.post("/baseline")
    async def baseline(request: Request) -> Response:
        review = read_review(await request.body())
        return Response(orjson.dumps(review_response(review, AdmissionResponse.allow())), media_type="application/json")

    paths = ensure_certs(certs_dir, "volcano-job-webhook", "volcano-job-webhook")
    # serve's connection limits at their defaults, as in production (guarded listener and protocol).
    build_server(app, "127.0.0.1", port, CertReloader.from_files(paths.cert, paths.key), limits=connection_limits(load_settings())).run()


if __name__ == "__main__":
    main()
