"""The Job a command works on, refused when it is too big to build offline."""

from __future__ import annotations

from volcano_job_webhook import documents
from volcano_job_webhook.plugins import Job

from .errors import CommandError

# The most Pods a job may have in all for the offline commands. Far past what a host list can hold
# (a ConfigMap's 1 MiB fits some 30,000 host names), and what ``resources`` builds in seconds.
MAX_REPLICAS = 100_000


def load_job(source: str) -> Job:
    """The Volcano Job in ``source`` (``-`` for standard input), with at most :data:`MAX_REPLICAS`."""
    job = documents.load_job(source)
    total = sum(task.replicas for task in job.tasks)
    if total > MAX_REPLICAS:
        raise CommandError(f"job {job.key}: {total} replicas in all, over the {MAX_REPLICAS} the offline commands build")
    return job
