"""Kubernetes Indexed Jobs and JobSets as job views for the plugins (docs/workloads.md): each is a
:class:`~.job.Job` whose tasks, Pod names and selectors come from its own kind, read from the spec as
the API server keeps it after defaulting."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .budget import digits_below
from .errors import PluginError
from .job import Job, Task, pod_template, read_count, task_name_checked
from .keys import (
    COMPLETION_INDEX_KEY,
    JOB_INDEX_KEY,
    OPT_IN_LABEL,
    PLUGINS_ANNOTATION,
    REPLICATED_JOB_KEY,
    TASK_ANNOTATION,
)
from .kinds import BATCH_JOB, JOBSET, kind_of
from .names import dns1123_label
from .pod import Obj, annotation_or_label

__all__ = ["IndexedJob", "JobSet", "finished_phase", "jobset_child", "opted_in", "read_workload", "require_opt_in"]

# Plugins that only make sense on Volcano's own labels.
_RAY = (
    "ray's head Service selects the head task's Pods by Volcano's task label (volcano.sh/task-spec), "
    "which a {kind}'s Pods do not carry; run Ray with KubeRay"
)


def read_workload(obj: Any) -> Job:
    """The job view of a Volcano Job, an Indexed Job or a JobSet, by its ``apiVersion`` and ``kind``.

    Raises :class:`PluginError` naming the field for anything that is not shaped like one."""
    kind = kind_of(obj) if isinstance(obj, Mapping) else None
    if kind is BATCH_JOB:
        return IndexedJob.from_object(obj)
    if kind is JOBSET:
        return JobSet.from_object(obj)
    return Job.from_object(obj)


def _templates(obj: Mapping[str, Any]) -> list[Any]:
    """The Pod templates of an Indexed Job or a JobSet, as they are in the object."""
    spec: Mapping[str, Any] = obj["spec"] if isinstance(obj.get("spec"), Mapping) else {}
    if kind_of(obj) is BATCH_JOB:
        return [spec.get("template")]
    jobs = spec.get("replicatedJobs")
    return [((rj.get("template") or {}).get("spec") or {}).get("template") if isinstance(rj, Mapping) else None
            for rj in (jobs if isinstance(jobs, list) else [])]


def jobset_child(obj: Mapping[str, Any]) -> bool:
    """Whether a batch Job is one JobSet made: its Pods are the JobSet's, wired as the JobSet's."""
    labels = (obj.get("metadata") or {}).get("labels")
    return kind_of(obj) is BATCH_JOB and isinstance(labels, Mapping) and bool(labels.get(JOBSET.pod_label))


def opted_in(obj: Mapping[str, Any]) -> bool:
    """Whether an Indexed Job or a JobSet asks for our plugins: our annotation, or the opt-in label
    on one of its Pod templates (whose Pods the webhook then wires, with the server's default plugins
    at least). A JobSet's own Jobs carry its template's label, but are the JobSet's: not on their own."""
    if jobset_child(obj):
        return False
    annotations = (obj.get("metadata") or {}).get("annotations")
    if isinstance(annotations, Mapping) and PLUGINS_ANNOTATION in annotations:
        return True
    for template in _templates(obj):
        labels = ((template or {}).get("metadata") or {}).get("labels") if isinstance(template, Mapping) else None
        if isinstance(labels, Mapping) and labels.get(OPT_IN_LABEL) == "true":
            return True
    return False


def finished_phase(obj: Mapping[str, Any]) -> str:
    """"Completed" or "Failed" for an Indexed Job or JobSet that will start no Pod again, else ""."""
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return ""
    if kind_of(obj) is JOBSET:
        terminal = status.get("terminalState")
        return terminal if terminal in ("Completed", "Failed") else ""
    for condition in status.get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed"):
            return "Completed" if condition["type"] == "Complete" else "Failed"
    return ""


def require_opt_in(job: Job) -> None:
    """Raise :class:`PluginError` when an Indexed Job's or JobSet's Pod template lacks the opt-in
    label: the webhook's ``objectSelector`` would never see its Pods, which would run unwired."""
    if not isinstance(job, (IndexedJob, JobSet)):
        return
    for task in job.tasks:
        labels = (task.template.get("metadata") or {}).get("labels") or {}
        if labels.get(OPT_IN_LABEL) != "true":
            raise PluginError(
                job.key, "", f"{task.template_path}.metadata.labels",
                f"the {job.kind} names plugins in {PLUGINS_ANNOTATION} but its Pod template lacks the label "
                f"{OPT_IN_LABEL}: \"true\": its Pods would never reach the webhook and would run unwired",
            )


def _indexed_spec(key: str, spec: Any, where: str) -> tuple[int, Mapping[str, Any]]:
    """A batch Job spec's member count and Pod template, checked to be Indexed."""
    if not isinstance(spec, Mapping):
        raise PluginError(key, "", where, "must be a Job spec")
    mode = spec.get("completionMode") or "NonIndexed"
    if mode != "Indexed":
        raise PluginError(key, "", f"{where}.completionMode",
                          f"is {mode!r}: only Indexed Jobs can be wired (a NonIndexed Job's Pods have no index)")
    # The API server's defaulting: no completions and no parallelism is one of each; Indexed
    # with parallelism alone is refused before it gets here.
    completions = read_count(key, spec.get("completions"), f"{where}.completions", 1 if spec.get("parallelism") is None else -1)
    if completions < 0:
        raise PluginError(key, "", f"{where}.completions", "an Indexed Job needs spec.completions")
    return completions, pod_template(key, f"{where}.template", spec.get("template"))


def _pod_template(template: Mapping[str, Any], subdomain: str | None) -> dict[str, Any]:
    """The template as its Pods are made: no fixed hostname (the Job controller names each Pod's
    ``<job>-<index>``), and the subdomain its controller sets when it sets one."""
    pod_spec = {k: v for k, v in (template.get("spec") or {}).items() if k != "hostname"}
    if subdomain is not None:
        pod_spec["subdomain"] = subdomain
    return {**template, "spec": pod_spec}


@dataclass(frozen=True, eq=False)
class IndexedJob(Job):
    """A ``batch/v1`` Job in ``Indexed`` completion mode: one task, a Pod per completion index."""

    api_version = BATCH_JOB.api_version
    kind = BATCH_JOB.kind
    task_field = COMPLETION_INDEX_KEY
    tasks_field = "spec"
    index_sources = f"no {COMPLETION_INDEX_KEY} annotation or label (the Job controller sets both)"
    refused: ClassVar[Mapping[str, str]] = {"ray": _RAY.format(kind=BATCH_JOB.noun)}

    @classmethod
    def from_object(cls, obj: Any) -> IndexedJob:
        key, spec, fields = cls._read(obj)
        name, annotations = fields["name"], fields["annotations"]
        completions, template = _indexed_spec(key, spec, "spec")
        task_name = annotations.get(TASK_ANNOTATION) or name
        problem = dns1123_label(str(task_name))
        if problem:
            where = f"metadata.annotations[{TASK_ANNOTATION}]" if annotations.get(TASK_ANNOTATION) else "metadata.name"
            raise PluginError(key, "", where, f"names the task: {problem}")
        task = Task(str(task_name), completions, 0, _pod_template(template, None), "spec.template", "spec.completions")
        return cls(**fields, tasks=(task,), plugins={}, phase=finished_phase(obj))

    def task_of(self, pod: Obj) -> str:
        return self.tasks[0].name

    def index_of(self, pod: Obj) -> str | None:
        return annotation_or_label(pod, COMPLETION_INDEX_KEY)

    def pod_selector(self) -> dict[str, str]:
        return {BATCH_JOB.pod_label: self.name}

    def task_selector(self, task: Task) -> dict[str, str]:
        return self.pod_selector()  # its one task is the whole Job

    def pod_name(self, task: str, index: int) -> str:
        """The Job controller's hostname for completion index ``index``: ``<job>-<index>``."""
        return f"{self.name}-{index}"

    def host_prefix(self, task: Task) -> str | None:
        return self.name

    def host_label_chars(self, task: Task) -> int:
        return task.replicas * (len(self.name) + 1) + digits_below(task.replicas)


@dataclass(frozen=True, eq=False)
class JobSet(Job):
    """A JobSet: a task per replicated Job, a member per (job index, completion index)."""

    api_version = JOBSET.api_version
    kind = JOBSET.kind
    task_field = REPLICATED_JOB_KEY
    tasks_field = "spec.replicatedJobs"
    index_sources = (f"no {JOB_INDEX_KEY} and {COMPLETION_INDEX_KEY} labels or annotations "
                     "(JobSet and the Job controller set them)")
    refused: ClassVar[Mapping[str, str]] = {"ray": _RAY.format(kind=JOBSET.noun)}
    # Completions of each replicated Job's Jobs, by task name.
    completions: Mapping[str, int] = field(default_factory=dict)
    @classmethod
    def from_object(cls, obj: Any) -> JobSet:
        key, spec, fields = cls._read(obj)
        network: Mapping[str, Any] = spec["network"] if isinstance(spec.get("network"), Mapping) else {}
        dns = network.get("enableDNSHostnames") is not False  # a headless Service named after the subdomain
        subdomain = (network.get("subdomain") or fields["name"]) if dns else None
        raw_jobs = spec.get("replicatedJobs")
        if not isinstance(raw_jobs, list) or not raw_jobs:
            raise PluginError(key, "", "spec.replicatedJobs", "the JobSet has no replicated Jobs")
        tasks: list[Task] = []
        completions: dict[str, int] = {}
        for position, raw in enumerate(raw_jobs):
            where = f"spec.replicatedJobs[{position}]"
            if not isinstance(raw, Mapping):
                raise PluginError(key, "", where, "must be an object")
            task_name = task_name_checked(key, f"{where}.name", raw.get("name"), tasks)
            replicas = read_count(key, raw.get("replicas"), f"{where}.replicas", 1)
            job_template = raw.get("template")
            if not isinstance(job_template, Mapping):
                raise PluginError(key, "", f"{where}.template", "must be a Job template")
            # JobSet's defaulting makes every child Job Indexed.
            job_spec = job_template.get("spec")
            job_spec = {"completionMode": "Indexed", **job_spec} if isinstance(job_spec, Mapping) else job_spec
            count, template = _indexed_spec(key, job_spec, f"{where}.template.spec")
            completions[task_name] = count
            tasks.append(Task(task_name, replicas * count, position, _pod_template(template, subdomain),
                              f"{where}.template.spec.template", f"{where}.replicas"))
        return cls(**fields, tasks=tuple(tasks), plugins={}, completions=completions, own_service=dns, phase=finished_phase(obj))

    def task_of(self, pod: Obj) -> str:
        return annotation_or_label(pod, REPLICATED_JOB_KEY) or ""

    def index_of(self, pod: Obj) -> str | None:
        job_index = annotation_or_label(pod, JOB_INDEX_KEY)
        completion = annotation_or_label(pod, COMPLETION_INDEX_KEY)
        if job_index is None or completion is None:
            return None
        if not (job_index.isascii() and job_index.isdigit() and completion.isascii() and completion.isdigit()):
            return f"{job_index}-{completion}"  # not a number: index_number says so
        count = self.completions.get(self.task_of(pod), 1)
        return str(int(job_index) * count + int(completion))

    def pod_selector(self) -> dict[str, str]:
        return {JOBSET.pod_label: self.name}

    def task_selector(self, task: Task) -> dict[str, str]:
        return {**self.pod_selector(), REPLICATED_JOB_KEY: task.name}

    def pod_name(self, task: str, index: int) -> str:
        """Member ``index`` of ``task``: ``<jobset>-<task>-<job index>-<completion index>``."""
        count = self.completions.get(task, 1) or 1
        return f"{self.name}-{task}-{index // count}-{index % count}"

    def host_prefix(self, task: Task) -> str | None:
        return None  # two counters in each name

    def host_label_chars(self, task: Task) -> int:
        count = self.completions.get(task.name, 1) or 1
        jobs = task.replicas // count
        return task.replicas * (len(self.name) + len(task.name) + 3) + count * digits_below(jobs) + jobs * digits_below(count)
