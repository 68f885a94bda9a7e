"""``volcano-webhook resources``: print the side objects the reconciler makes for a job, with the chain
``reconcile`` builds from the same settings (``--config``, ``VOLCANO_WEBHOOK_*``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from volcano_job_webhook.documents import dump_yaml_stream

from .inputs import add_config_argument, chain_from, load_job


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("resources", help="print the side objects a job needs")
    parser.add_argument("--job", required=True, metavar="JOB", help="Volcano Job, Indexed Job or JobSet file (YAML or JSON, - for stdin)")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    add_config_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    chain, job = chain_from(args, on_cluster=True), load_job(args.job)
    objects = chain.resources(job)
    volcano = sorted(chain.volcano_runs(job))
    if volcano:
        # Not ours to make: said on stderr, so the objects printed stay a clean stream.
        print(f"note: {', '.join(volcano)} run by Volcano's controller, which makes their objects (docs/install.md#who-runs-what)",
              file=sys.stderr)
    if args.output == "json":
        print(json.dumps(objects, indent=2, ensure_ascii=False))
    else:
        print(dump_yaml_stream(objects), end="")
    return 0
