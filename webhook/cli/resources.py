"""``volcano-webhook resources``: print the side objects a job needs, as the reconciler makes them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from volcano_job_webhook.documents import dump_yaml_stream
from volcano_job_webhook.plugins import Chain

from .inputs import load_job


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("resources", help="print the side objects a job needs")
    parser.add_argument("--job", required=True, metavar="JOB", help="Volcano Job file (YAML or JSON, - for stdin)")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    objects = Chain().resources(load_job(args.job))
    if args.output == "json":
        print(json.dumps(objects, indent=2, ensure_ascii=False))
    else:
        print(dump_yaml_stream(objects), end="")
    return 0
