"""The Job a command works on, refused when it is too big to build offline."""

from __future__ import annotations

from volcano_job_webhook import documents
from volcano_job_webhook.limits import check_replicas
from volcano_job_webhook.plugins import Job


def load_job(source: str) -> Job:
    """The Volcano Job in ``source`` (``-`` for standard input), with at most
    :data:`~volcano_job_webhook.limits.MAX_JOB_REPLICAS` replicas in all."""
    job = documents.load_job(source)
    check_replicas(job)
    return job
