"""What the commands share: the Job and the Pod they work on, within bounds, the view they show (offline,
or ``--cluster``) and its chain, built from the settings as ``serve`` and ``reconcile`` build it, and output."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterable
from typing import Any

from volcano_job_webhook import documents
from volcano_job_webhook.config import WebhookSettings, load_settings
from volcano_job_webhook.limits import check_replicas
from volcano_job_webhook.plugins import Chain, Job, PreparedJob, read_workload
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.admission import ReviewError, read_review
from volcano_job_webhook.server.shape import pod_shape_problem

EXIT_BAD_INPUT = 2


class CommandError(Exception):
    """Bad input to a command: printed as one line, exit status 2."""


def load_job(source: str) -> Job:
    """The Volcano Job, Indexed Job or JobSet in ``source`` (``-``: stdin), at most ``MAX_JOB_REPLICAS`` Pods."""
    job = read_workload(documents.load_object(source, ("Job", "JobSet")))
    check_replicas(job)
    return job


def build_pod(job: Job, task_name: str | None, index: int) -> dict[str, Any]:
    """Pod ``index`` of the task (``--task``, or the job's one task when it has one: an Indexed Job's) as
    its controller builds it; an index the task has no Pod for is refused (the plugins would number a
    Pod that never exists: ``RANK=100`` beside ``WORLD_SIZE=4``)."""
    if task_name is None:
        if len(job.tasks) != 1:
            raise CommandError(f"give --task: the job has {len(job.tasks)} tasks ({', '.join(t.name for t in job.tasks)})")
        task_name = job.tasks[0].name
    task = job.task(task_name)
    if task is not None and not 0 <= index < task.replicas:
        where = f"job {job.key}: task {task.name}: --index {index}"
        replicas = f"{task.replicas} replica{'' if task.replicas == 1 else 's'}"
        if index < 0:
            raise CommandError(f"{where}: an index is 0 or more (the task has {replicas})")
        if task.replicas == 0:
            raise CommandError(f"{where}: the task has 0 replicas, so no Pod to build")
        indexes = "index 0 only" if task.replicas == 1 else f"indexes 0 to {task.replicas - 1}"
        raise CommandError(f"{where}: the task has {replicas}, {indexes}")
    return make_pod(job, task_name, index)  # an unknown task: refused there, naming the job's tasks


def load_pod(source: str) -> dict[str, Any]:
    """The Pod in ``source``: a Pod, or an AdmissionReview (v1 or v1beta1, as ``review`` prints)
    whose ``request.object`` is one, with ``request.namespace`` where the Pod names none."""
    obj = documents.load_object(source, ("Pod", "AdmissionReview"))
    pod = obj
    if obj.get("kind") == "AdmissionReview":
        try:
            request = read_review(obj).request
        except ReviewError as exc:
            raise CommandError(f"{source}: {exc}") from None
        assert request is not None  # read_review refuses a review without one
        if request.kind.kind != "Pod" or request.kind.group:
            raise CommandError(f"{source}: the AdmissionReview is for a {request.kind.kind}, not a Pod")
        pod = request.object
        if not isinstance(pod, dict) or pod.get("kind") not in (None, "Pod"):
            raise CommandError(f"{source}: request.object: missing or not a Pod")
        meta = pod.get("metadata")
        if request.namespace and isinstance(meta, dict) and not meta.get("namespace"):
            pod = {**pod, "metadata": {**meta, "namespace": request.namespace}}
    problem = pod_shape_problem(pod)
    if problem is not None:
        raise CommandError(f"{source}: {problem}")
    return pod


def process_settings(args: argparse.Namespace) -> WebhookSettings:
    """``serve``'s or ``reconcile``'s settings: each flag over the setting of its name (webhook/config.py)."""
    flags = {name: value for name, value in vars(args).items() if name in WebhookSettings.model_fields}
    return load_settings(args.config, namespaces=args.namespace or None, **flags)


def add_view_arguments(parser: argparse.ArgumentParser, cluster: str, offline: str, output: str) -> None:
    """What every offline command takes: ``--job``, and last ``--cluster`` (its two views, described), ``-o`` and ``--config``."""
    parser.add_argument("--job", required=True, metavar="JOB", help="Volcano Job, Indexed Job or JobSet file (YAML or JSON, - for stdin)")
    parser.add_argument("--cluster", action="store_true",
                        help=f"the cluster view: {cluster} (the defaults of serve --job-source=kube and reconcile; Volcano's "
                             f"controller runs the plugins of spec.plugins it knows, or those of volcano_controller_plugins "
                             f"in --config). Default: the offline view, {offline}")
    parser.add_argument("-o", "--output", choices=("json", "yaml"), default=output, help=f"output format (default {output})")
    parser.add_argument("--config", help="YAML settings file, as for serve and reconcile (also VOLCANO_WEBHOOK_CONFIG)")


@dataclasses.dataclass(frozen=True)
class View:
    """The chain a command shows, and the job as that chain sees it: offline, every plugin runs as if
    nothing else did; in the cluster view, Volcano's controller runs its plugins and we the rest."""

    cluster: bool
    chain: Chain
    job: Job


def who_runs(prepared: PreparedJob) -> tuple[list[str], list[str]]:
    """The job's plugins Volcano's controller runs (none offline), and those we run, each in chain order."""
    return ([n for n in prepared.names if n in prepared.volcano], [n for n in prepared.names if n not in prepared.volcano])


def view_of(args: argparse.Namespace, job: Job) -> View:
    """The view ``--cluster`` asks for, its chain built from ``--config``, the environment and the defaults."""
    settings = load_settings(args.config)
    if args.cluster:
        return View(True, settings.chain(on_cluster=True), job)
    # Nothing else runs: not even the plugins a job's status says Volcano's controller ran.
    config = dataclasses.replace(settings.chain_config(on_cluster=False), volcano_plugins=frozenset())
    offline_job = dataclasses.replace(job, controlled=frozenset()) if job.controlled else job
    return View(False, Chain(config=config), offline_job)


def names(plugins: Iterable[str]) -> str:
    return ", ".join(plugins) or "none"


def say(line: str) -> None:
    """One line on stderr, so that what is printed on stdout stays a clean document."""
    print(line, file=sys.stderr)


def warn(warnings: Iterable[str]) -> None:
    for warning in dict.fromkeys(warnings):
        say(f"warning: {warning}")


def emit(value: Any, output: str, *, stream: bool = False) -> None:
    """``value`` on stdout as JSON or YAML (``stream``: a list of objects as a ``---`` stream)."""
    if output == "json":
        print(json.dumps(value, indent=2, ensure_ascii=False))
    else:
        print(documents.dump_yaml(value, stream), end="")
