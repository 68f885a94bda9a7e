"""``volcano-webhook mutate``: print a Pod as the chain ``serve`` builds from the same settings wires it
(or the JSON patch), offline (every plugin) or ``--cluster`` (Volcano's controller's part, then the webhook's)."""

from __future__ import annotations

import argparse
from typing import Any

from volcano_job_webhook.server.patch import make_patch

from .inputs import (
    CommandError,
    add_view_arguments,
    build_pod,
    emit,
    load_job,
    load_pod,
    names,
    say,
    view_of,
    warn,
    who_runs,
)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("mutate", help="print a Pod as the plugin chain wires it",
                            description="Print a Pod as the plugin chain wires it, or the JSON patch (--patch).")
    parser.add_argument("pod", metavar="POD", nargs="?",
                        help="Pod file, or the AdmissionReview `review` prints (YAML or JSON, - for stdin)")
    parser.add_argument("--task", help="instead of a POD: the task whose Pod to build as its controller does "
                        "(a replicated Job of a JobSet; not needed for a job of one task)")
    parser.add_argument("--index", type=int, default=None,
                        help="instead of a POD: the Pod's index in its task, 0 to replicas-1 (default 0)")
    parser.add_argument("--patch", action="store_true", help="print the RFC 6902 JSON patch instead of the Pod")
    add_view_arguments(parser, "the Pod as it runs, Volcano's wiring and the webhook's, and with --patch exactly the "
                       "patch the webhook answers for the Pod Volcano's controller sends",
                       "every plugin of the job run on the Pod, as if nothing else ran", output="json")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    if args.pod is not None:
        if args.task is not None or args.index is not None:
            raise CommandError("give a POD file or --task and --index, not both")
        pod = load_pod(args.pod)
    elif args.task is not None or args.index is not None or len(job.tasks) == 1:
        pod = build_pod(job, args.task, args.index or 0)
    else:
        raise CommandError("give a POD file, or --task (and --index) to build the Pod as its controller does")
    view = view_of(args, job)
    prepared = view.chain.prepare(view.job)
    # What reaches the webhook: in the cluster view, the Pod Volcano's controller has wired with
    # its plugins (a Pod they wired already is left as it is); offline, the Pod as given.
    sent = prepared.volcano_part(pod)
    result = prepared.mutate(sent.pod, volcano_wired=True)
    volcano, ours = who_runs(prepared)
    volcano_part = (f"Volcano's controller wired it with {names(volcano)}" if volcano
                    else "Volcano's controller runs none of the job's plugins")
    if not view.cluster:
        say("view: offline: every plugin of the job run on the Pod, as if nothing else ran "
            "(--cluster: as on a cluster where Volcano's controller runs its plugins)")
    elif args.patch:
        say(f"view: cluster: the webhook's answer (it runs {names(ours)}) to the Pod as its controller sends it; {volcano_part}")
    else:
        say(f"view: cluster: the Pod as it runs, wired by the webhook ({names(ours)}); {volcano_part}; "
            "--patch shows the webhook's part alone")
    warn([*sent.warnings, *result.warnings])
    emit(make_patch(sent.pod, result.pod) if args.patch else result.pod, args.output)
    return 0
