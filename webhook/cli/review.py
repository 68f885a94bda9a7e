"""``volcano-webhook review``: print the AdmissionReview the API server sends for a job's Pod."""

from __future__ import annotations

import argparse
import json
from typing import Any

from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.review import API_VERSIONS, admission_review

from .inputs import load_job


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("review", help="print the AdmissionReview the API server sends for a job's Pod")
    parser.add_argument("--job", required=True, metavar="JOB", help="Volcano Job file (YAML or JSON, - for stdin)")
    parser.add_argument("--task", required=True, help="task of the Pod")
    parser.add_argument("--index", type=int, default=0, help="replica index (default 0)")
    parser.add_argument("--api-version", choices=API_VERSIONS, default=API_VERSIONS[0])
    parser.add_argument("--uid", default="00000000-0000-4000-8000-000000000000", help="request uid")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    pod = make_pod(load_job(args.job), args.task, args.index)
    print(json.dumps(admission_review(pod, api_version=args.api_version, uid=args.uid), indent=2, ensure_ascii=False))
    return 0
