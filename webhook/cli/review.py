"""``volcano-webhook review``: print the AdmissionReview the API server sends for a job's Pod under the
settings of ``serve``: offline the Pod before any plugin, with ``--cluster`` as Volcano's controller sends
it. Never stricter than the cluster: Volcano's plugins are judged as its controller judges them."""

from __future__ import annotations

import argparse
from typing import Any

from volcano_job_webhook.config import load_settings
from volcano_job_webhook.server.admission import API_VERSIONS, admission_review

from .inputs import (
    add_view_arguments,
    build_pod,
    emit,
    load_job,
    names,
    say,
    warn,
    who_runs,
)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("review", help="print the AdmissionReview the API server sends for a job's Pod",
                            description="Print the AdmissionReview the API server sends to the webhook for a job's Pod "
                                        "(mutate takes it as its POD).")
    parser.add_argument("--task", help="task of the Pod (not needed for a job of one task)")
    parser.add_argument("--index", type=int, default=0, help="replica index, 0 to replicas-1 (default 0)")
    parser.add_argument("--api-version", choices=API_VERSIONS, default=API_VERSIONS[0])
    parser.add_argument("--uid", default="00000000-0000-4000-8000-000000000000", help="request uid")
    add_view_arguments(parser, "the Pod as Volcano's controller sends it, wired by the plugins it runs",
                       "the Pod as its controller creates it, before any plugin runs (what serve with job files is sent)", output="json")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    pod = build_pod(job, args.task, args.index)
    # Whatever the view, the Pod exists once Volcano's controller created it: its plugins are built
    # as it builds them (Go's flag parsing, problems logged), so only ours can refuse, as the webhook does.
    prepared = load_settings(args.config).chain(on_cluster=True).prepare(job)
    volcano, _ = who_runs(prepared)
    warnings = list(prepared.warnings)
    if args.cluster:
        sent = prepared.volcano_part(pod)
        pod, warnings = sent.pod, sent.warnings
        say("view: cluster: the Pod as its controller sends it, " + (f"wired by the plugins Volcano's controller runs: {names(volcano)}"
            if volcano else "as it creates it: Volcano's controller runs none of the job's plugins"))
    else:
        say("view: offline: the Pod as its controller creates it, before any plugin runs "
            "(--cluster: as Volcano's controller sends it, wired by the plugins it runs)")
    warn(warnings)
    emit(admission_review(pod, api_version=args.api_version, uid=args.uid), args.output)
    return 0
