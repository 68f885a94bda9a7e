"""``volcano-webhook review``: print the AdmissionReview the API server sends for a job's Pod, the Pod as
Volcano's controller makes it under the same settings as ``serve`` (``--config``, ``VOLCANO_WEBHOOK_*``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.review import API_VERSIONS, admission_review

from .inputs import add_config_argument, chain_from, load_job, pod_task


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("review", help="print the AdmissionReview the API server sends for a job's Pod")
    parser.add_argument("--job", required=True, metavar="JOB",
                        help="Volcano Job, Indexed Job or JobSet file (YAML or JSON, - for stdin)")
    parser.add_argument("--task", help="task of the Pod (not needed for a job of one task)")
    parser.add_argument("--index", type=int, default=0, help="replica index (default 0)")
    parser.add_argument("--api-version", choices=API_VERSIONS, default=API_VERSIONS[0])
    parser.add_argument("--uid", default="00000000-0000-4000-8000-000000000000", help="request uid")
    add_config_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    # The Pod as Volcano's controller sends it: wired by the plugins it runs (none, unless the
    # settings say it runs some), as it reaches our webhook.
    pod = chain_from(args).prepare(job).volcano_part(make_pod(job, pod_task(job, args.task), args.index)).pod
    print(json.dumps(admission_review(pod, api_version=args.api_version, uid=args.uid), indent=2, ensure_ascii=False))
    return 0
