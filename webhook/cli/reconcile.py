"""``volcano-webhook reconcile``: run the reconciler that keeps each job's side objects."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from volcano_job_webhook.config import load_settings


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("reconcile", help="create, update and clean up each job's side objects")
    parser.add_argument("--config", help="YAML settings file (also VOLCANO_WEBHOOK_CONFIG)")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig (default in-cluster)")
    parser.add_argument("--namespace", action="append", help="watch only this namespace (repeatable)")
    parser.add_argument("--health-port", type=int, default=8081, help="plain-HTTP /healthz, /readyz, /metrics (default 8081)")
    parser.add_argument("--leader-elect", action="store_true", help="only the holder of a Lease writes")
    parser.add_argument("--lease-name", default="volcano-job-webhook-reconciler")
    parser.add_argument("--lease-namespace", help="default: $POD_NAMESPACE")
    parser.add_argument("--resync-seconds", type=float, default=300.0, help="how often every job is reconciled anyway")
    parser.add_argument("--workers", type=_positive, default=4,
                        help="jobs reconciled at once (default 4); one job is never in two workers")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(run=run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def run(args: argparse.Namespace) -> int:
    from volcano_job_webhook.reconciler.run import run as run_reconciler

    settings = load_settings(args.config, namespaces=args.namespace or None, log_level=args.log_level, kubeconfig=args.kubeconfig)
    run_reconciler(
        settings,
        health_port=args.health_port,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace,
        resync_seconds=args.resync_seconds,
        workers=args.workers,
    )
    return 0
