"""The benchmark's server: the real ``serve`` app plus ``/baseline``, an endpoint that parses the
AdmissionReview and answers allowed with no patch — the floor every figure is compared with.

Run as ``python bench/server.py JOBS_DIR CERTS_DIR PORT``; it is pinned to one core by the caller.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
from fastapi import Request
from fastapi.responses import Response

from plugins import Chain
from webhook import logs
from webhook.admission import AdmissionResponse, parse_review, review_response
from webhook.app import create_app
from webhook.certs import ensure_certs
from webhook.jobsource import DirectoryJobSource
from webhook.tls import serve


def main() -> None:
    jobs_dir, certs_dir, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    logs.configure("info")  # serve's default level, as in production
    app = create_app(DirectoryJobSource(jobs_dir), Chain())

    @app.post("/baseline")
    async def baseline(request: Request) -> Response:
        review = parse_review(orjson.loads(await request.body()))
        return Response(orjson.dumps(review_response(review, AdmissionResponse.allow())), media_type="application/json")

    paths = ensure_certs(certs_dir, "volcano-job-webhook", "volcano-job-webhook")
    serve(app, "127.0.0.1", port, paths.cert, paths.key)


if __name__ == "__main__":
    main()
