"""``volcano-webhook reconcile``: run the reconciler that keeps each job's side objects."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .inputs import process_settings


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("reconcile", help="create, update and clean up each job's side objects")
    parser.add_argument("--config", help="YAML settings file (also VOLCANO_WEBHOOK_CONFIG)")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig (default in-cluster)")
    parser.add_argument("--namespace", action="append", help="watch only this namespace (repeatable)")
    parser.add_argument("--health-port", type=int, help="plain-HTTP /healthz, /readyz, /metrics")
    parser.add_argument("--leader-elect", action="store_true", default=None, help="only the holder of a Lease works")
    parser.add_argument("--lease-name")
    parser.add_argument("--lease-namespace", help="default: $POD_NAMESPACE")
    parser.add_argument("--resync-seconds", type=float, help="how often every job is reconciled anyway")
    parser.add_argument("--workers", type=int, help="jobs reconciled at once; one job is never in two workers")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from volcano_job_webhook.reconciler.process import run as run_reconciler

    return run_reconciler(process_settings(args))
