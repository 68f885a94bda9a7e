"""``volcano-webhook serve``: run the HTTPS admission webhook."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .inputs import process_settings


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("serve", help="run the HTTPS admission webhook")
    parser.add_argument("--config", help="YAML settings file (also VOLCANO_WEBHOOK_CONFIG)")
    parser.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, help="HTTPS port (default 8443)")
    parser.add_argument("--certs-dir", type=Path, help="ca.crt, tls.crt, tls.key; created when absent (default ./certs)")
    parser.add_argument("--client-ca-file", type=Path, help="require client certificates signed by this CA")
    parser.add_argument("--job-source", choices=("files", "kube"), help="where Jobs are looked up (default files)")
    parser.add_argument("--jobs-dir", type=Path, help="Job files for --job-source=files (default: the example jobs shipped with the package)")
    parser.add_argument("--kubeconfig", type=Path, help="kubeconfig for --job-source=kube (default in-cluster)")
    parser.add_argument("--namespace", action="append", help="watch only this namespace (repeatable)")
    parser.add_argument("--enforcement", choices=("deny", "audit"),
                        help="audit: allow, with a warning, what would be denied (default deny)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from volcano_job_webhook.server.run import run as run_server

    run_server(process_settings(args))
    return 0
