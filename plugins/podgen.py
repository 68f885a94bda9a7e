"""The Pod Volcano's controller builds for a task replica, before plugins (``createJobPod``,
docs/volcano-behaviour.md#the-pod-before-plugins). Used by the CLI to show what a job's Pods become without a Pod file, and to make
sample AdmissionReviews."""

from __future__ import annotations

import copy
from typing import Any

from .errors import PluginError
from .job import Job
from .keys import GROUP_NAME_KEY, JOB_NAME_KEY, JOB_NAMESPACE_KEY, QUEUE_NAME_KEY, TASK_INDEX_KEY, TASK_SPEC_KEY

DEFAULT_SCHEDULER = "volcano"


def make_pod(job: Job, task_name: str, index: int) -> dict[str, Any]:
    """Replica ``index`` of task ``task_name`` as ``createJobPod`` makes it (job volumes left out)."""
    task = job.task(task_name)
    if task is None:
        raise PluginError(job.key, "", "task", f"the job has no task {task_name!r}")
    spec = job.raw.get("spec") or {}
    status = job.raw.get("status") or {}
    queue = spec.get("queue") or "default"
    template = copy.deepcopy(dict(task.template))
    meta = template.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    labels.update({
        TASK_INDEX_KEY: str(index),
        JOB_NAME_KEY: job.name,
        TASK_SPEC_KEY: task.name,
        JOB_NAMESPACE_KEY: job.namespace,
        QUEUE_NAME_KEY: queue,
    })
    annotations = dict(meta.get("annotations") or {})
    annotations.update({
        TASK_INDEX_KEY: str(index),
        TASK_SPEC_KEY: task.name,
        GROUP_NAME_KEY: f"{job.name}-{job.uid}",
        JOB_NAME_KEY: job.name,
        QUEUE_NAME_KEY: queue,
        "volcano.sh/job-version": str(status.get("version", 0)),
        "volcano.sh/template-uid": f"{job.name}-{task.name}",
        "volcano.sh/job-retry-count": str(status.get("retryCount", 0)),
    })
    pod_spec = template.get("spec") or {}
    if not pod_spec.get("schedulerName"):
        # Volcano's job admission names its scheduler in a job that names none.
        pod_spec["schedulerName"] = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if not pod_spec.get("priorityClassName") and spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = spec["priorityClassName"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": job.pod_name(task.name, index),
            "namespace": job.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [job.owner_reference()],
        },
        "spec": pod_spec,
    }
