"""``volcano-webhook resources``: print the side objects a job's plugins make, with the chain ``reconcile``
builds from the same settings: every plugin's offline, with ``--cluster`` only what the reconciler makes."""

from __future__ import annotations

import argparse
from typing import Any

from .inputs import add_view_arguments, emit, load_job, names, say, view_of, warn, who_runs


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("resources", help="print the side objects a job needs",
                            description="Print the side objects (ConfigMaps, Services, NetworkPolicies, Secrets) a job's plugins make.")
    add_view_arguments(parser, "only the objects the reconciler makes, those of the plugins Volcano's controller runs "
                       "being its own", "the objects of every plugin of the job, as if nothing else ran", output="yaml")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    view = view_of(args, load_job(args.job))
    # Built and checked as mutate builds them: a job whose Pods would be refused has no objects either.
    prepared = view.chain.prepare(view.job)
    objects = view.chain.resources(view.job)
    volcano, _ = who_runs(prepared)
    if view.cluster:
        say("view: cluster: the objects the reconciler makes; " + (f"Volcano's controller makes those of {names(volcano)}" if volcano
            else "Volcano's controller runs none of the job's plugins"))
    else:
        say("view: offline: the objects of every plugin of the job, as if nothing else ran "
            "(--cluster: only those the reconciler makes beside Volcano's controller)")
    warn(prepared.warnings)
    emit(objects, args.output, stream=True)
    return 0
