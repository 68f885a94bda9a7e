"""What the offline commands share: the Job they work on (refused when it is too big to build
offline), and the chain, built from the settings exactly as ``serve`` and ``reconcile`` build it."""

from __future__ import annotations

import argparse

from volcano_job_webhook import documents
from volcano_job_webhook.config import load_settings
from volcano_job_webhook.limits import check_replicas
from volcano_job_webhook.plugins import Chain, Job

from .errors import CommandError


def load_job(source: str) -> Job:
    """The Volcano Job, Indexed Job or JobSet in ``source`` (``-`` for standard input), with at most
    :data:`~volcano_job_webhook.limits.MAX_JOB_REPLICAS` replicas in all."""
    job = documents.load_job(source)
    check_replicas(job)
    return job


def pod_task(job: Job, task: str | None) -> str:
    """``--task``, or the job's one task when it has one (an Indexed Job's)."""
    if task is not None:
        return task
    if len(job.tasks) == 1:
        return job.tasks[0].name
    raise CommandError(f"give --task: the job has {len(job.tasks)} tasks ({', '.join(t.name for t in job.tasks)})")


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML settings file, as for serve and reconcile (also VOLCANO_WEBHOOK_CONFIG)")


def chain_from(args: argparse.Namespace, on_cluster: bool | None = None) -> Chain:
    """The chain of the settings in ``--config``, the environment and the defaults."""
    return load_settings(args.config).chain(on_cluster)
