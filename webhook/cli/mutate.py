"""``volcano-webhook mutate``: print a Pod as the plugin chain wires it (or the JSON patch): the chain
``serve`` builds from the same settings (``--config``, ``VOLCANO_WEBHOOK_*``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from volcano_job_webhook.documents import load_object
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.patch import make_patch

from .errors import CommandError
from .inputs import add_config_argument, chain_from, load_job, pod_task


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("mutate", help="print a Pod as the plugin chain wires it")
    parser.add_argument("--job", required=True, metavar="JOB",
                        help="Volcano Job, Indexed Job or JobSet file (YAML or JSON, - for stdin)")
    parser.add_argument("pod", metavar="POD", nargs="?", help="Pod file (YAML or JSON, - for stdin)")
    parser.add_argument("--task", help="instead of a Pod file: the task whose Pod to build as its controller does "
                        "(a replicated Job of a JobSet; not needed for a job of one task)")
    parser.add_argument("--index", type=int, default=None, help="instead of a Pod file: the Pod's index in its task (default 0)")
    parser.add_argument("--patch", action="store_true", help="print the RFC 6902 JSON patch instead of the Pod")
    add_config_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    if args.pod is not None:
        pod = load_object(args.pod, "Pod")
    elif args.task is not None or args.index is not None or len(job.tasks) == 1:
        pod = make_pod(job, pod_task(job, args.task), args.index or 0)
    else:
        raise CommandError("give a POD file, or --task (and --index) to build the Pod as its controller does")
    # Every plugin, Volcano's controller's and ours: the Pod as it runs on the cluster.
    result = chain_from(args).prepare(job).mutate(pod)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    out = make_patch(pod, result.pod) if args.patch else result.pod
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 0
