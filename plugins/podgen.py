"""The Pod Volcano's controller builds for a task replica, before plugins (``createJobPod``,
docs/volcano-behaviour.md#the-pod-before-plugins), and the Pod the Job controller builds for an
Indexed Job's or a JobSet's member (docs/workloads.md#the-pods). Used by the CLI to show what a
job's Pods become without a Pod file, and to make sample AdmissionReviews."""

from __future__ import annotations

import copy
from typing import Any

from .errors import PluginError, did_you_mean
from .job import Job, Task
from .keys import (
    BATCH_JOB_NAME_KEY,
    COMPLETION_INDEX_KEY,
    GROUP_NAME_KEY,
    JOB_INDEX_KEY,
    JOB_NAME_KEY,
    JOB_NAMESPACE_KEY,
    JOBSET_NAME_KEY,
    JOBSET_UID_KEY,
    QUEUE_NAME_KEY,
    REPLICATED_JOB_KEY,
    TASK_INDEX_KEY,
    TASK_SPEC_KEY,
)
from .kinds import BATCH_JOB
from .workloads import IndexedJob, JobSet

DEFAULT_SCHEDULER = "volcano"


def make_pod(job: Job, task_name: str, index: int) -> dict[str, Any]:
    """Replica ``index`` of task ``task_name`` as ``createJobPod`` makes it (job volumes left out)."""
    task = job.task(task_name)
    if task is None:
        names = [t.name for t in job.tasks]
        raise PluginError(job.key, "", "task",
                          f"the job has no task {task_name!r}{did_you_mean(task_name, names, repr)} (tasks: {', '.join(names)})")
    if isinstance(job, (IndexedJob, JobSet)):
        if not 0 <= index < task.replicas:
            raise PluginError(job.key, "", "index", f"task {task.name!r} has {task.replicas} Pods: no index {index}")
        return _member_pod(job, task.name, index)
    spec = job.raw.get("spec") or {}
    status = job.raw.get("status") or {}
    queue = spec.get("queue") or "default"
    labels = {
        TASK_INDEX_KEY: str(index),
        JOB_NAME_KEY: job.name,
        TASK_SPEC_KEY: task.name,
        JOB_NAMESPACE_KEY: job.namespace,
        QUEUE_NAME_KEY: queue,
    }
    annotations = {
        TASK_INDEX_KEY: str(index),
        TASK_SPEC_KEY: task.name,
        GROUP_NAME_KEY: f"{job.name}-{job.uid}",
        JOB_NAME_KEY: job.name,
        QUEUE_NAME_KEY: queue,
        "volcano.sh/job-version": str(status.get("version", 0)),
        "volcano.sh/template-uid": f"{job.name}-{task.name}",
        "volcano.sh/job-retry-count": str(status.get("retryCount", 0)),
    }
    pod = _pod(job, task, {"name": job.pod_name(task.name, index)}, labels, annotations, {"ownerReferences": [job.owner_reference()]})
    pod_spec = pod["spec"]
    if not pod_spec.get("schedulerName"):
        # Volcano's job admission names its scheduler in a job that names none.
        pod_spec["schedulerName"] = spec.get("schedulerName") or DEFAULT_SCHEDULER
    if not pod_spec.get("priorityClassName") and spec.get("priorityClassName"):
        pod_spec["priorityClassName"] = spec["priorityClassName"]
    return pod


def _pod(job: Job, task: Task, identity: dict[str, str], labels: dict[str, str], annotations: dict[str, str],
         owned: dict[str, Any]) -> dict[str, Any]:
    """A Pod of a copy of ``task``'s template: ``identity`` (its name) in the job's namespace, the
    template's labels and annotations with ``labels`` and ``annotations`` over them, then ``owned``."""
    template = copy.deepcopy(dict(task.template))
    meta = template.get("metadata") or {}
    metadata = {**identity, "namespace": job.namespace, "labels": {**(meta.get("labels") or {}), **labels},
                "annotations": {**(meta.get("annotations") or {}), **annotations}, **owned}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template.get("spec") or {}}


def _member_pod(job: IndexedJob | JobSet, task_name: str, index: int) -> dict[str, Any]:
    """Member ``index`` as the Job controller makes it: the pod template with the completion index
    as label and annotation, the hostname ``<Job>-<completion index>``, the Job's labels and owner
    reference; for a JobSet member, of the child Job ``<jobset>-<replicated job>-<job index>`` with
    JobSet's labels and annotations as well (its ``labelAndAnnotateObject``)."""
    task = job.task(task_name)
    assert task is not None
    if isinstance(job, JobSet):
        count = job.completions.get(task_name, 1) or 1
        job_index, completion = divmod(index, count)
        child, child_uid = f"{job.name}-{task_name}-{job_index}", f"{job.uid or 'jobset'}-{task_name}-{job_index}"
        extra = {JOBSET_NAME_KEY: job.name, JOBSET_UID_KEY: job.uid, REPLICATED_JOB_KEY: task_name, JOB_INDEX_KEY: str(job_index)}
    else:
        completion, child, child_uid, extra = index, job.name, job.uid, {}
    labels = {**extra, "batch.kubernetes.io/controller-uid": child_uid, COMPLETION_INDEX_KEY: str(completion),
              BATCH_JOB_NAME_KEY: child, "controller-uid": child_uid, "job-name": child}
    owner = {"apiVersion": BATCH_JOB.api_version, "kind": BATCH_JOB.kind, "name": child, "uid": child_uid, "controller": True,
             "blockOwnerDeletion": True}
    pod = _pod(job, task, {"generateName": f"{child}-{completion}-"}, labels, {**extra, COMPLETION_INDEX_KEY: str(completion)},
               {"finalizers": ["batch.kubernetes.io/job-tracking"], "ownerReferences": [owner]})
    pod["spec"]["hostname"] = f"{child}-{completion}"
    return pod
