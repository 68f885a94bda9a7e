"""A read-only view of a Volcano Job for the plugins (docs/volcano-behaviour.md#the-job-object). Host
names are Volcano's ``MakeDomainName`` (docs/volcano-behaviour.md#host-names); :meth:`Job.host_suffix`
is the one place that qualifies them in a cluster domain."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .budget import digits_below
from .errors import PluginError
from .keys import (
    CONTROLLED_PREFIX,
    FINISHED_PHASES,
    JOB_NAME_KEY,
    JOB_NAMESPACE_KEY,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TASK_SPEC_KEY,
)
from .kinds import VOLCANO_JOB, Kind
from .names import dns1123_label
from .pod import Obj, task_index, task_name


@dataclass(frozen=True)
class Task:
    """One entry of ``spec.tasks``: its name, replica count, position and pod template."""

    name: str
    replicas: int
    position: int
    template: Mapping[str, Any]
    # Field paths in the workload, for errors (a Volcano task's spec.tasks[position].template, ...).
    template_path: str
    replicas_path: str

    @property
    def hostname(self) -> str:
        return (self.template.get("spec") or {}).get("hostname") or ""

    @property
    def subdomain(self) -> str:
        return (self.template.get("spec") or {}).get("subdomain") or ""

    @property
    def containers(self) -> list[dict[str, Any]]:
        return (self.template.get("spec") or {}).get("containers") or []


def read_count(key: str, value: Any, where: str, default: int) -> int:
    """A replica or completion count of job ``key`` at ``where``: ``default`` when unset."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PluginError(key, "", where, f"must be a non-negative integer, got {value!r}")
    return value


def task_name_checked(key: str, where: str, name: Any, tasks: Sequence[Task]) -> str:
    """A task's name at ``where``: a string, a DNS label, not the name of one of ``tasks``."""
    problem = dns1123_label(name) if isinstance(name, str) else "must be a string"
    if not problem and any(task.name == name for task in tasks):
        problem = f"duplicate task name {name!r}"
    if problem:
        raise PluginError(key, "", where, problem)
    return str(name)


def pod_template(key: str, where: str, template: Any) -> Mapping[str, Any]:
    """A task's pod template at ``where``, checked to be one."""
    if not isinstance(template, Mapping) or not isinstance(template.get("spec") or {}, Mapping):
        raise PluginError(key, "", where, "must be a pod template object")
    return template


@dataclass(frozen=True, eq=False)
class Job:
    """A Volcano Job as the plugins see it. Build one with :meth:`from_object`.

    Compared and hashed by identity: a Job is a snapshot of one resourceVersion. Other workload
    kinds (:mod:`.workloads`) are views of the same shape that answer the questions below their own
    way: which task and index a Pod has, what its host name is, what selects the job's Pods."""

    # The workload's API, for owner references and messages.
    api_version: ClassVar[str] = VOLCANO_JOB.api_version
    kind: ClassVar[str] = VOLCANO_JOB.kind
    # Where a Pod names its task, for errors.
    task_field: ClassVar[str] = TASK_SPEC_KEY
    # Where the job lists its tasks, for errors.
    tasks_field: ClassVar[str] = "spec.tasks"
    # Where index_of looks, for the error when it finds nothing.
    index_sources: ClassVar[str] = "no volcano.sh/task-index label or annotation, and the name does not end in -<index>"
    # The plugins that cannot wire this kind of workload, each with why.
    refused: ClassVar[Mapping[str, str]] = {}

    name: str
    namespace: str
    # metadata.uid; a workload without one (a file's: kubectl apply refuses a file that names another
    # uid than the stored object's) is given :meth:`stable_uid`, so that what is built from a file is
    # the same on every read (Pods' owner references, the PodGroup's name, torchrun's rendezvous id).
    uid: str
    tasks: tuple[Task, ...]
    plugins: Mapping[str, list[str]]
    annotations: Mapping[str, str]
    raw: Mapping[str, Any] = field(repr=False, compare=False)
    # status.state.phase ("" before Volcano's controller has written one).
    phase: str = ""
    # The plugins Volcano's controller has run on the job, from status.controlledResources
    # ("plugin-<name>": "<name>"): proof that their objects are Volcano's.
    controlled: frozenset[str] = frozenset()
    # The workload's own controller makes the headless Service its Pods' subdomain names (a JobSet's
    # enableDNSHostnames, on by default): svc makes none.
    own_service: bool = False

    @classmethod
    def from_object(cls, obj: Any) -> Job:
        """A Job from its API object; :class:`PluginError` naming the field for anything not shaped like one."""
        key, spec, fields = cls._read(obj)
        raw_tasks = spec.get("tasks")
        if not isinstance(raw_tasks, list) or not raw_tasks:
            raise PluginError(key, "", "spec.tasks", "the Job has no tasks")
        tasks: list[Task] = []
        for position, raw in enumerate(raw_tasks):
            where = f"spec.tasks[{position}]"
            if not isinstance(raw, Mapping):
                raise PluginError(key, "", where, "must be an object")
            # Volcano's job admission names unnamed tasks "default<position>"; its CRD: MaxLength 63,
            # pattern ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ (docs/volcano-behaviour.md#job-admission).
            name = task_name_checked(key, f"{where}.name", raw.get("name") or f"default{position}", tasks)
            replicas = read_count(key, raw.get("replicas", 0), f"{where}.replicas", 0)
            template = pod_template(key, f"{where}.template", raw.get("template") or {})
            tasks.append(Task(name, replicas, position, template, f"{where}.template", f"{where}.replicas"))
        plugins = spec.get("plugins") or {}
        if not isinstance(plugins, Mapping):
            raise PluginError(key, "", "spec.plugins", "must be a map of plugin name to argument list")
        status = obj.get("status")
        status = status if isinstance(status, Mapping) else {}
        state = status.get("state")
        phase = state.get("phase") if isinstance(state, Mapping) else None
        controlled = status.get("controlledResources")
        return cls(
            **fields,
            tasks=tuple(tasks),
            plugins=dict(plugins),
            phase=phase if isinstance(phase, str) else "",
            controlled=frozenset(
                key[len(CONTROLLED_PREFIX):] for key in (controlled if isinstance(controlled, Mapping) else {})
                if isinstance(key, str) and key.startswith(CONTROLLED_PREFIX)
            ),
        )

    @classmethod
    def _read(cls, obj: Any) -> tuple[str, Mapping[str, Any], dict[str, Any]]:
        """What every kind reads alike: the workload's ``namespace/name``, its spec, and the fields
        ``name``, ``namespace``, ``uid``, ``annotations`` and ``raw``; :class:`PluginError` naming the field."""
        if not isinstance(obj, Mapping):
            raise PluginError("?", "", "job", f"expected a {cls.kind} object, got {type(obj).__name__}")
        meta = obj.get("metadata")
        if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise PluginError("?", "", "metadata.name", f"the {cls.kind} has no name")
        name, namespace = meta["name"], meta.get("namespace") or "default"
        key = f"{namespace}/{name}"
        if not isinstance(namespace, str):
            raise PluginError(key, "", "metadata.namespace", "must be a string")
        if obj.get("kind") not in (None, cls.kind):
            raise PluginError(key, "", "kind", f"expected {cls.kind!r}, got {obj.get('kind')!r}")
        annotations = meta.get("annotations") or {}
        if not isinstance(annotations, Mapping):
            raise PluginError(key, "", "metadata.annotations", "must be a map")
        spec = obj.get("spec")
        if not isinstance(spec, Mapping):
            raise PluginError(key, "", "spec", f"the {cls.kind} has no spec")
        uid = str(meta.get("uid") or cls.stable_uid(namespace, name))
        return key, spec, {"name": name, "namespace": namespace, "uid": uid, "annotations": dict(annotations), "raw": obj}

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        """In a phase Volcano never leaves: no Pod of the job will be created again."""
        return self.phase in FINISHED_PHASES

    def task_of(self, pod: Obj) -> str:
        """The name of the task ``pod`` belongs to (docs/volcano-behaviour.md#task-and-index)."""
        return task_name(pod)

    def index_of(self, pod: Obj) -> str | None:
        """``pod``'s index within its task as written on it, or None when nothing says."""
        return task_index(pod)

    def pod_selector(self) -> dict[str, str]:
        """Labels every Pod of the job carries and no other Pod does (Services, NetworkPolicies)."""
        return {JOB_NAME_KEY: self.name, JOB_NAMESPACE_KEY: self.namespace}

    def task_selector(self, task: Task) -> dict[str, str]:
        """Labels every Pod of ``task`` carries and no other Pod does."""
        return {**self.pod_selector(), TASK_SPEC_KEY: task.name}

    def host_prefix(self, task: Task) -> str | None:
        """``p`` such that member ``i`` of ``task`` is called ``p-i`` (an init container writes long
        host lists from it), or None when names do not follow that pattern."""
        return f"{self.name}-{task.name}"

    def host_label_chars(self, task: Task) -> int:
        """Characters in all of :meth:`host_labels` without a fixed hostname (one per member)."""
        # <job>-<task>-<i>: the fixed part per replica, then the index's digits.
        return task.replicas * (len(self.name) + len(task.name) + 2) + digits_below(task.replicas)

    def task(self, name: str) -> Task | None:
        """The task called ``name``, or None (Volcano's ``GetTaskIndexUnderJob`` == -1)."""
        for task in self.tasks:
            if task.name == name:
                return task
        return None

    def replicas(self, name: str) -> int:
        """Replicas of the task called ``name``, 0 when there is none."""
        task = self.task(name)
        return task.replicas if task else 0

    def pod_name(self, task: str, index: int) -> str:
        """``MakePodName``: ``<job>-<task>-<index>``."""
        return f"{self.name}-{task}-{index}"

    def host_suffix(self, task: Task, cluster_domain: str | None = None) -> str:
        """What follows a host label of ``task`` in its domain name: the subdomain (the template's, else
        the job's name), or with ``cluster_domain`` the name fully qualified in the job's namespace,
        ``<subdomain>.<namespace>.svc.<cluster_domain>``. Every host name a plugin writes ends so."""
        subdomain = task.subdomain or self.name
        return f"{subdomain}.{self.namespace}.svc.{cluster_domain}" if cluster_domain else subdomain

    def domain_name(self, task: Task, index: int, cluster_domain: str | None = None) -> str:
        """``MakeDomainName``: ``<hostname or pod name>.<subdomain or job name>`` (:meth:`host_suffix`)."""
        return f"{task.hostname or self.pod_name(task.name, index)}.{self.host_suffix(task, cluster_domain)}"

    def host_labels(self, task: Task) -> list[str]:
        """The hostnames of a task's Pods as svc, ssh and mpi list them: one per replica, or a single
        entry when the template fixes ``hostname`` (docs/volcano-behaviour.md#host-names). As long as the
        replicas: callers size it first with :func:`budget.task_hosts`."""
        if task.hostname:
            return [task.hostname] if task.replicas else []
        return [self.pod_name(task.name, i) for i in range(task.replicas)]

    @classmethod
    def stable_uid(cls, namespace: str, name: str) -> str:
        """The uid a workload of this kind without one is given: a UUID (version 5) of its group, kind,
        namespace and name, the same on every read and another for each workload."""
        group = cls.api_version.rpartition("/")[0]
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"https://volcano-job-webhook.io/{group}/{cls.kind}/{namespace}/{name}"))

    def host_names(self, task: Task, cluster_domain: str | None = None) -> list[str]:
        """``host_labels`` qualified with the subdomain (:meth:`host_suffix`): the domain names the
        Pods answer to."""
        suffix = self.host_suffix(task, cluster_domain)
        return [f"{label}.{suffix}" for label in self.host_labels(task)]

    def owner_reference(self) -> dict[str, Any]:
        """The controller reference Volcano puts on everything it makes for a job."""
        return {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def side_object(self, kind: Kind, name: str, **content: Any) -> dict[str, Any]:
        """A side object of the job: ``kind``'s ``apiVersion`` and ``kind``, :meth:`object_meta`, then ``content``."""
        return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": self.object_meta(name), **content}

    def object_meta(self, name: str) -> dict[str, Any]:
        """Metadata for a side resource: Volcano's name, namespace and owner, plus our managed-by label."""
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [self.owner_reference()],
        }

