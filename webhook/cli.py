"""``volcano-webhook``: the command line.

Offline commands run the same plugin chain as the server on files:

* ``mutate --job JOB.yaml POD.yaml`` prints the wired Pod (``--patch``: the JSON patch);
* ``resources --job JOB.yaml`` prints the job's side objects as the reconciler creates them.

Exit status 0 on success, 2 with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from plugins import Chain, Job, PluginError
from plugins.podgen import make_pod

from .documents import DocumentError, dump_yaml_stream, load_object
from .patch import make_patch

EXIT_BAD_INPUT = 2


class CommandError(Exception):
    """Bad input to a command: printed as one line, exit status 2."""


def _job(source: str) -> Job:
    return Job.from_object(load_object(source, "Job"))


def cmd_mutate(args: argparse.Namespace, chain: Chain) -> int:
    job = _job(args.job)
    if args.pod is not None:
        pod = load_object(args.pod, "Pod")
    elif args.task is not None:
        pod = make_pod(job, args.task, args.index)
    else:
        raise CommandError("give a POD file, or --task (and --index) to build the Pod as Volcano's controller does")
    result = chain.mutate(job, pod)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    out = make_patch(pod, result.pod) if args.patch else result.pod
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 0


def cmd_resources(args: argparse.Namespace, chain: Chain) -> int:
    objects = chain.resources(_job(args.job))
    if args.output == "json":
        print(json.dumps(objects, indent=2, ensure_ascii=False))
    else:
        print(dump_yaml_stream(objects), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="volcano-webhook", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    mutate = sub.add_parser("mutate", help="print a Pod as the plugin chain wires it")
    mutate.add_argument("--job", required=True, metavar="JOB", help="Volcano Job file (YAML or JSON, - for stdin)")
    mutate.add_argument("pod", metavar="POD", nargs="?", help="Pod file (YAML or JSON, - for stdin)")
    mutate.add_argument("--task", help="instead of a Pod file: the task whose Pod to build as Volcano's controller does")
    mutate.add_argument("--index", type=int, default=0, help="replica index with --task (default 0)")
    mutate.add_argument("--patch", action="store_true", help="print the RFC 6902 JSON patch instead of the Pod")
    mutate.set_defaults(handler=cmd_mutate)

    resources = sub.add_parser("resources", help="print the side objects a job needs")
    resources.add_argument("--job", required=True, metavar="JOB", help="Volcano Job file (YAML or JSON, - for stdin)")
    resources.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    resources.set_defaults(handler=cmd_resources)
    return parser


Handler = Callable[[argparse.Namespace, Chain], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args, Chain())
    except (PluginError, DocumentError, CommandError) as exc:
        print(f"volcano-webhook {args.command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
