"""Volcano's job controller (``vc-controller-manager --controllers=job-controller`` at ``ed72c7c``)
emulated, so the scenarios beside Volcano run on a machine without its binary (tests/cluster.py
picks the real one where it exists; tests/test_volcano_controller.py runs each check on both).

It ports the parts of ``pkg/controllers/job`` that make the writes ../shared/real-kubernetes.md
documents, for the Jobs of one namespace: the states (``state/*.go``), ``syncJob``, ``killPods``,
``initiateJob``, the PodGroup, the plugin hooks (our plugins in Volcano's order and strictness, the
Pods built by plugins/podgen.py and created through the API so admission runs), Commands,
``PodFailed``/``TaskCompleted`` policies, Events, and the retries up to ``max_requeue`` of
``processNextReq``/``handleJobError``. It holds only what those scenarios reach, level-based: every
``interval`` it lists the namespace and syncs each Job an informer event would have queued. Not
Volcano's: plugins in registration order (Volcano's is a Go map's), one retry counter per Job; not
done: ``RestartTask``/``RestartPod``, scaling, ``minSuccess``, ``dependsOn``, queue forwarding.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.envtest import read_path, request, status_message
from tests.jobs import API_VERSION as JOB_API_VERSION
from tests.jobs import job_owner
from volcano_job_webhook.plugins import Chain, ChainConfig, Job, PluginError
from volcano_job_webhook.plugins.base import Plugin
from volcano_job_webhook.plugins.keys import (
    JOB_NAME_KEY,
    MANAGED_BY_LABEL,
    PLUGINS_ANNOTATION,
    TASK_SPEC_KEY,
)
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.plugins.registry import BUILTIN_ORDER, BUILTINS, Registry

Obj = dict[str, Any]

COMPONENT = "vc-controller-manager"
OUT_OF_SYNC_KEY = "volcano.sh/controller-out-of-sync"
JOB_VERSION_KEY = "volcano.sh/job-version"
DEFAULT_MAX_RETRY = 3  # the Job CRD's default of spec.maxRetry
FINISHED = frozenset({"Completed", "Terminated", "Failed", "Aborted"})
SOFT = frozenset({"Succeeded", "Failed"})  # PodRetainPhaseSoft
NONE: frozenset[str] = frozenset()  # PodRetainPhaseNone

# Volcano's eight plugins, without the dependencies Volcano's job *admission* adds (svc for mpi...):
# its controller runs exactly what spec.plugins names, and no Volcano admission runs here.
VOLCANO_PLUGINS = BUILTIN_ORDER
_REGISTRY = Registry(type(BUILTINS[name].__name__, (BUILTINS[name],), {"requires": ()}) for name in VOLCANO_PLUGINS)

# REST paths: (prefix, plural) by kind.
PATHS = {
    "Job": ("/apis/batch.volcano.sh/v1alpha1", "jobs"),
    "PodGroup": ("/apis/scheduling.volcano.sh/v1beta1", "podgroups"),
    "Command": ("/apis/bus.volcano.sh/v1alpha1", "commands"),
    "Queue": ("/apis/scheduling.volcano.sh/v1beta1", "queues"),
    "Pod": ("/api/v1", "pods"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "Service": ("/api/v1", "services"),
    "Event": ("/api/v1", "events"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
}


def path(kind: str, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
    prefix, plural = PATHS[kind]
    out = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    return out + (f"/{name}" if name else "") + (f"/{subresource}" if subresource else "")


def list_items(api: client.ApiClient, collection: str, selector: str | None = None) -> list[Obj]:
    """The items at a collection's path, label-selected when ``selector`` is given."""
    items: list[Obj] = request(api, "GET", collection, query=[("labelSelector", selector)] if selector else [])["items"]
    return items


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _go_duration(seconds: float) -> str:
    """Go's ``time.Duration.String`` for whole seconds (metav1.Duration's JSON)."""
    total = int(seconds)
    if total <= 0:
        return "0s"
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def _omitempty(value: Any) -> Any:
    """A status as Go's ``omitempty`` would serialize it: zero numbers, empty maps and lists gone."""
    if isinstance(value, dict):
        out = {k: _omitempty(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (0, "", None, {}, []) or isinstance(v, bool)}
    if isinstance(value, list):
        return [_omitempty(v) for v in value]
    return value


def _controlled_by(obj: Obj, uid: str) -> bool:
    return any(r.get("controller") and r.get("uid") == uid for r in (obj.get("metadata") or {}).get("ownerReferences") or [])


def _phase(obj: Obj | None) -> str:
    return str(((obj or {}).get("status") or {}).get("phase") or "")


def _job_phase(job: Obj) -> str:
    return str(((job.get("status") or {}).get("state") or {}).get("phase") or "")


class SyncError(Exception):
    """A sync that failed the way Volcano's does (it is retried)."""


@dataclass(frozen=True)
class Write:
    """One write the API server took from the controller, in order: ``verb`` (create, update, patch,
    delete), kind and name."""

    verb: str
    kind: str
    name: str


@dataclass
class Counters:
    """What the controller did so far (a snapshot: see :attr:`VolcanoController.counters`)."""

    created: Counter[str] = field(default_factory=Counter)  # by kind, successful creates
    key_pairs: int = 0  # SSH key pairs generated (ssh's OnJobAdd, whether or not the Secret was written)
    pod_create_failures: int = 0  # Pod creations the API server refused (AlreadyExists aside)
    sync_failures: int = 0  # syncs that failed and were retried or ended the job
    status_writes: int = 0  # Job status updates


@dataclass
class _Tracked:
    """What Volcano's cache and work queue hold for one Job."""

    uid: str
    guards: dict[str, str]  # the cached status.controlledResources the plugin hooks read and write
    seen: tuple[str, str] | None = None  # (spec, phase) last seen: the job update events Volcano reacts to
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (resourceVersion, phase)
    podgroup: tuple[str, str] | None = None  # (uid, phase)
    actions: list[str] = field(default_factory=list)
    requeues: int = 0
    retry_at: float | None = None


@dataclass
class _Sync:
    """One request being handled: the Job as cached, its Pods and PodGroup."""

    job: Obj
    tracked: _Tracked
    pods: list[Obj]
    podgroup: Obj | None

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.job["metadata"]["namespace"])

    @property
    def spec(self) -> Obj:
        spec: Obj = self.job.get("spec") or {}
        return spec


UpdateStatus = Callable[[Obj], bool]


class VolcanoController:
    """Volcano's job controller for ``namespace``, through an administrator's client; :attr:`errors`
    holds the emulator's own failures (a test ends with it empty)."""

    def __init__(self, api: client.ApiClient, namespace: str, *, interval: float = 0.05, max_requeue: int = 15,
                 retry_base: float = 0.005, retry_cap: float = 0.05) -> None:
        self.api, self.namespace = api, namespace
        self.interval, self.max_requeue = interval, max_requeue
        # Volcano backs off from 5 ms to 1000 s; capped at 50 ms, its 15 retries take well under a second.
        self.retry_base, self.retry_cap = retry_base, retry_cap
        self._lock = threading.Lock()
        self._counters = Counters()
        self._writes: list[Write] = []
        self.errors: list[BaseException] = []
        self._tracked: dict[str, _Tracked] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ticks = 0

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> VolcanoController:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"volcano-controller:{self.namespace}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            assert not self._thread.is_alive(), "the Volcano controller emulator did not stop"
            self._thread = None

    def __enter__(self) -> VolcanoController:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # a bug of the emulator: kept for the test to see, and go on
                with self._lock:
                    self.errors.append(exc)
            self._stop.wait(self.interval)

    # -- what tests read ----------------------------------------------------------------------

    @property
    def counters(self) -> Counters:
        with self._lock:
            return copy.deepcopy(self._counters)

    @property
    def writes(self) -> list[Write]:
        with self._lock:
            return list(self._writes)

    # -- API calls ------------------------------------------------------------------------------

    def _call(self, method: str, url: str, body: Any = None, content_type: str = "application/json") -> Any:
        return request(self.api, method, url, body=body, content_type=content_type)

    def _list(self, kind: str, selector: str | None = None) -> list[Obj]:
        return list_items(self.api, path(kind, self.namespace), selector)

    def _get(self, kind: str, name: str, namespace: str | None = None) -> Obj | None:
        return read_path(self.api, path(kind, namespace, name))

    def _record(self, verb: str, kind: str, name: str) -> None:
        with self._lock:
            self._writes.append(Write(verb, kind, name))
            if verb == "create":
                self._counters.created[kind] += 1

    def _create(self, kind: str, obj: Obj) -> Obj:
        created: Obj = self._call("POST", path(kind, obj["metadata"].get("namespace")), obj)
        self._record("create", kind, created["metadata"]["name"])
        return created

    def _update(self, kind: str, obj: Obj, subresource: str | None = None) -> Obj:
        meta = obj["metadata"]
        updated: Obj = self._call("PUT", path(kind, meta.get("namespace"), meta["name"], subresource), obj)
        self._record("update", kind, meta["name"])
        return updated

    def _delete(self, kind: str, name: str) -> bool:
        """Delete by name; False when it was not there (Volcano ignores NotFound)."""
        try:
            self._call("DELETE", path(kind, self.namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        self._record("delete", kind, name)
        return True

    def _event(self, job: Obj, type_: str, reason: str, message: str) -> None:
        """What client-go's event recorder writes (best effort, as it is)."""
        meta = job["metadata"]
        now = _now()
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Job", "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"],
                               "apiVersion": JOB_API_VERSION, "resourceVersion": meta.get("resourceVersion", "")},
            "reason": reason, "message": message, "type": type_, "source": {"component": COMPONENT},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self._create("Event", event)
        except ApiException:
            pass

    def _update_status(self, c: _Sync, job: Obj) -> Obj:
        stored = self._update("Job", job, "status")
        with self._lock:
            self._counters.status_writes += 1
        c.job = stored
        return stored

    # -- the loop: what the informers would have queued ---------------------------------------------

    def tick(self) -> None:
        """One look at the namespace, and the syncs it calls for."""
        self.ticks += 1
        jobs = self._list("Job")
        pods = self._list("Pod", JOB_NAME_KEY)
        podgroups = {pg["metadata"]["name"]: pg for pg in self._list("PodGroup")}
        by_name = {job["metadata"]["name"]: job for job in jobs}
        for command in self._list("Command"):
            self._command(command, by_name)
        now = time.monotonic()
        for job in jobs:
            meta = job["metadata"]
            tracked = self._tracked.get(meta["uid"])
            if tracked is None:
                guards = dict((job.get("status") or {}).get("controlledResources") or {})
                tracked = self._tracked[meta["uid"]] = _Tracked(meta["uid"], guards)
            own = [p for p in pods if (p["metadata"].get("annotations") or {}).get(JOB_NAME_KEY) == meta["name"]
                   and _controlled_by(p, meta["uid"])]
            podgroup = podgroups.get(f"{meta['name']}-{meta['uid']}") or podgroups.get(meta["name"])
            queued = self._observe(job, tracked, own, podgroup)
            action = tracked.actions.pop(0) if tracked.actions else None
            due = tracked.retry_at is not None and now >= tracked.retry_at
            if action or queued or due:
                self._process(_Sync(copy.deepcopy(job), tracked, own, podgroup), action or "SyncJob")
        alive = {job["metadata"]["uid"] for job in jobs}
        for uid in [u for u in self._tracked if u not in alive]:
            del self._tracked[uid]

    def _command(self, command: Obj, jobs: Mapping[str, Obj]) -> None:
        """``processNextCommand``: a Command for a Job is deleted, then its action queued."""
        target = command.get("target") or {}
        if target.get("kind") != "Job" or target.get("apiVersion") != JOB_API_VERSION:
            return
        if not self._delete("Command", command["metadata"]["name"]):
            return
        job = jobs.get(target.get("name", ""))
        if job is None:
            return
        action = str(command.get("action") or "SyncJob")
        self._event(job, "Normal", "CommandIssued",
                    f"Start to execute command {action}, and clean it up to make sure executed not more than once.")
        tracked = self._tracked.get(job["metadata"]["uid"])
        if tracked is not None:
            tracked.actions.append(action)
        else:
            guards = dict((job.get("status") or {}).get("controlledResources") or {})
            self._tracked[job["metadata"]["uid"]] = _Tracked(job["metadata"]["uid"], guards, actions=[action])

    def _observe(self, job: Obj, tracked: _Tracked, pods: list[Obj], podgroup: Obj | None) -> bool:
        """Whether an informer event would have queued the Job since the last look; pod events that
        match a policy queue its action."""
        queued = False
        seen = (json.dumps(job.get("spec"), sort_keys=True), _job_phase(job))
        if seen != tracked.seen:  # updateJob: a new Job, or a change of its spec or phase
            queued, tracked.seen = True, seen
        now = {p["metadata"]["name"]: (p["metadata"]["resourceVersion"], _phase(p)) for p in pods}
        if now != tracked.pods:  # addPod, updatePod, deletePod
            queued = True
            for pod in pods:
                name, phase = pod["metadata"]["name"], _phase(pod)
                before = tracked.pods.get(name, ("", ""))[1]
                if phase != before and phase in ("Failed", "Succeeded"):
                    action = self._policy_action(job, pod, pods)
                    if action:
                        tracked.actions.append(action)
            tracked.pods = now
        group = (podgroup["metadata"]["uid"], _phase(podgroup)) if podgroup else None
        if group and tracked.podgroup and group[0] == tracked.podgroup[0] and group[1] != tracked.podgroup[1]:
            queued = True  # updatePodGroup: the phase of the same PodGroup changed
        elif group and (not tracked.podgroup or group[0] != tracked.podgroup[0]) and group[1] not in ("", "Pending"):
            # A PodGroup first seen already past the empty phase it was made with: a watch would
            # have shown its ADDED and then the MODIFIED that set the phase (this look polls).
            queued = True
        tracked.podgroup = group
        return queued

    def _policy_action(self, job: Obj, pod: Obj, pods: list[Obj]) -> str | None:
        """``applyPolicies`` for a Pod that just failed or succeeded: task policies, then the Job's."""
        annotations = pod["metadata"].get("annotations") or {}
        if OUT_OF_SYNC_KEY in annotations:
            return None
        status = job.get("status") or {}
        if int(annotations.get(JOB_VERSION_KEY) or 0) < int(status.get("version") or 0):
            return None  # a request from before the last kill: Volcano syncs instead
        task = annotations.get(TASK_SPEC_KEY, "")
        if _phase(pod) == "Failed":
            event = "PodFailed"
        else:
            task_pods = [p for p in pods if (p["metadata"].get("annotations") or {}).get(TASK_SPEC_KEY) == task]
            if not all(_phase(p) == "Succeeded" for p in task_pods):
                return None
            event = "TaskCompleted"
        spec = job.get("spec") or {}
        task_policies = next((t.get("policies") or [] for t in spec.get("tasks") or [] if t.get("name") == task), [])
        for policy in [*task_policies, *(spec.get("policies") or [])]:
            events = [policy["event"]] if policy.get("event") else list(policy.get("events") or [])
            if event in events or "*" in events:
                return str(policy.get("action") or "SyncJob")
        return None

    def _process(self, c: _Sync, action: str) -> None:
        """``processNextReq``: run the action in the Job's state; on failure retry, up to the limit."""
        try:
            if action not in ("SyncJob", "EnqueueJob", "ResumeJob"):
                self._event(c.job, "Normal", "ExecuteAction", f"Start to execute action {action} ")
            self._execute(c, action)
        except (ApiException, PluginError, SyncError) as exc:
            self._failed(c, action, exc)
            return
        c.tracked.requeues, c.tracked.retry_at = 0, None

    def _failed(self, c: _Sync, action: str, exc: BaseException) -> None:
        """``handleJobError``: requeue with backoff, or past ``max_requeue`` terminate the Job."""
        tracked = c.tracked
        with self._lock:
            self._counters.sync_failures += 1
        if self.max_requeue == -1 or tracked.requeues < self.max_requeue:
            tracked.requeues += 1
            tracked.retry_at = time.monotonic() + min(self.retry_base * 2 ** (tracked.requeues - 1), self.retry_cap)
            return
        tracked.requeues, tracked.retry_at = 0, None
        self._event(c.job, "Normal", "ExecuteAction", f"Job failed on action {action} for retry limit reached")
        try:
            self._execute(c, "TerminateJob")
        except (ApiException, PluginError, SyncError):
            pass  # Volcano logs it; the Job stays as it is until the next event

    # -- the states (state/*.go) ------------------------------------------------------------------

    def _execute(self, c: _Sync, action: str) -> None:
        phase = _job_phase(c.job)
        spec = c.spec
        if phase in ("", "Pending", "Running"):
            if action == "RestartJob":
                return self._kill(c, NONE, _restarted)
            if action in ("RestartTask", "RestartPod", "RestartPartition"):
                raise NotImplementedError(f"the Volcano controller emulator does not do {action}")
            if action == "TerminateJob":
                return self._kill(c, SOFT, _to("Terminating"))
            return self._sync(c, _pending_update(spec) if phase != "Running" else _running_update(spec))
        if phase == "Restarting":
            update = _restarting_update(spec)
            return self._sync(c, update) if action == "SyncJob" else self._kill(c, NONE, update)
        if phase == "Terminating":
            return self._kill(c, SOFT, _when_gone("Terminated"))
        if phase in FINISHED:
            return self._kill(c, SOFT, None)
        return self._sync(c, _pending_update(spec))  # an unknown phase is Pending to Volcano

    # -- syncJob ------------------------------------------------------------------------------------

    def _sync(self, c: _Sync, update: UpdateStatus | None) -> None:
        spec = c.spec
        queue = spec.get("queue") or "default"
        if self._get("Queue", queue) is None:
            raise SyncError(f'queue.scheduling.volcano.sh "{queue}" not found')
        if _job_phase(c.job) in ("", "Pending"):
            self._initiate(c)
        else:
            self._on_job_update(c)
        podgroup = c.podgroup
        status: Obj = c.job.setdefault("status", {})
        if podgroup is None or _phase(podgroup) in ("", "Pending"):
            before = copy.deepcopy(status)
            if update is not None:
                update(status)
            if _omitempty(status) == _omitempty(before):
                return
            _transition(status)
            status["controlledResources"] = dict(c.tracked.guards)  # the cached status carries the plugins' map
            c.job["status"] = _omitempty(status)
            self._update_status(c, c.job)
            return
        counts: Counter[str] = Counter()
        task_counts: dict[str, dict[str, int]] = {}
        by_task: dict[str, dict[str, Obj]] = {}
        for pod in c.pods:
            task = (pod["metadata"].get("annotations") or {}).get(TASK_SPEC_KEY)
            if task is not None:
                by_task.setdefault(task, {})[pod["metadata"]["name"]] = pod
        to_create: dict[str, list[Obj]] = {}
        to_delete: list[Obj] = []
        job, chain = volcano_chain(c.job)
        prepared = None
        for task in spec.get("tasks") or []:
            existing = by_task.pop(task["name"], {})
            for index in range(int(task.get("replicas") or 0)):
                name = f"{c.name}-{task['name']}-{index}"
                pod = existing.pop(name, None)
                if pod is None:  # OnPodCreate on the Pod createJobPod builds; an error fails the whole sync
                    prepared = prepared or chain.prepare(job)
                    to_create.setdefault(task["name"], []).append(prepared.mutate(make_pod(job, task["name"], index)).pod)
                    continue
                if OUT_OF_SYNC_KEY in (pod["metadata"].get("annotations") or {}):
                    to_delete.append(pod)
                _classify(pod, counts, task_counts)
            to_delete.extend(existing.values())
        to_delete.extend(p for pods in by_task.values() for p in pods.values())
        errors = []
        for pods in to_create.values():
            for pod in pods:
                try:
                    created = self._create("Pod", pod)
                except ApiException as exc:
                    if exc.status == 409:
                        continue  # AlreadyExists: counted when the cache has it
                    with self._lock:
                        self._counters.pod_create_failures += 1
                    errors.append(f"failed to create pod {pod['metadata']['name']}, err: {_reason(exc)}")
                    continue
                _classify(created, counts, task_counts)
        if errors:
            self._event(c.job, "Warning", "FailedCreate", f"Error creating pods: [{' '.join(errors)}]")
            # (len of the per-task map, as Volcano's message has it)
            raise SyncError(f"failed to create {len(errors)} pods of {len(to_create)}")
        deletion_errors = []
        for pod in to_delete:
            try:
                self._delete("Pod", pod["metadata"]["name"])
                counts["terminating"] += 1
            except ApiException as exc:
                deletion_errors.append(_reason(exc))
        if deletion_errors:
            self._event(c.job, "Warning", "FailedDelete", f"Error deleting pods: [{' '.join(deletion_errors)}]")
            raise SyncError(f"failed to delete {len(deletion_errors)} pods of {len(to_delete)}")
        new = {
            "state": status.get("state"), **{k: counts[k] for k in ("pending", "running", "succeeded", "failed", "terminating", "unknown")},
            "version": status.get("version", 0), "minAvailable": spec.get("minAvailable", 0),
            "taskStatusCount": _task_status(task_counts), "controlledResources": dict(c.tracked.guards),
            "conditions": status.get("conditions"), "retryCount": status.get("retryCount", 0),
        }
        if update is not None:
            update(new)
        # Volcano compares with the cached status whose controlledResources is the very map the plugin
        # hooks filled: a change of that map alone is never written.
        if _omitempty(new) == _omitempty({**status, "controlledResources": dict(c.tracked.guards)}):
            return
        _transition(new)
        c.job["status"] = _omitempty(new)
        self._update_status(c, c.job)

    def _initiate(self, c: _Sync) -> None:
        """``initiateJob``: status Pending, the plugins' OnJobAdd, the PodGroup."""
        status = c.job.setdefault("status", {})
        if not _job_phase(c.job):
            status["state"] = {"phase": "Pending"}
            status["minAvailable"] = c.spec.get("minAvailable", 0)
            _transition(status)
            c.job["status"] = _omitempty(status)
            self._update_status(c, c.job)
        try:
            self._on_job_add(c)
        except (ApiException, PluginError, SyncError) as exc:
            self._event(c.job, "Warning", "PluginError", f"Execute plugin when job add failed, err: {_reason(exc)}")
            raise
        try:
            self._create_or_update_podgroup(c)
        except ApiException as exc:
            self._event(c.job, "Warning", "PodGroupError", f"Failed to create PodGroup, err: {_reason(exc)}")
            raise

    def _on_job_update(self, c: _Sync) -> None:
        """``initOnJobUpdate``: svc's OnJobUpdate writes the ConfigMap whatever its guard says (so it
        comes back at once after a restart); then the PodGroup (made again after a restart)."""
        for plugin in self._plugins(c):
            if plugin.name == "svc":
                config_map = _volcano_object(plugin.resources(None)[0])
                self._create_or_update_data("ConfigMap", config_map, ("data",))
        self._create_or_update_podgroup(c)

    def _create_or_update_podgroup(self, c: _Sync) -> None:
        spec, meta = c.spec, c.job["metadata"]
        min_task_member = {t["name"]: _min_task_member(t) for t in spec.get("tasks") or []}
        podgroup = c.podgroup
        if podgroup is None:
            pg_meta: Obj = {"name": f"{meta['name']}-{meta['uid']}", "namespace": meta["namespace"],
                            "ownerReferences": [job_owner(c.job)]}
            if meta.get("annotations"):
                pg_meta["annotations"] = meta["annotations"]
            if meta.get("labels"):
                pg_meta["labels"] = meta["labels"]
            pg_spec = _omitempty({"minMember": spec.get("minAvailable", 0), "minTaskMember": min_task_member,
                                  "queue": spec.get("queue") or "default", "priorityClassName": spec.get("priorityClassName")})
            body = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": pg_meta,
                    "spec": pg_spec, "status": {}}
            try:
                c.podgroup = self._create("PodGroup", body)
            except ApiException as exc:
                if exc.status != 409:
                    raise

    # -- killPods -------------------------------------------------------------------------------------

    def _kill(self, c: _Sync, retain: frozenset[str], update: UpdateStatus | None) -> None:
        job, spec = c.job, c.spec
        status = job.setdefault("status", {})
        status["version"] = int(status.get("version") or 0) + 1  # bumped only when the job is killed
        last_retry = int(status.get("retryCount") or 0) >= int(spec.get("maxRetry", DEFAULT_MAX_RETRY)) - 1
        counts: Counter[str] = Counter()
        task_counts: dict[str, dict[str, int]] = {}
        # The double deletes at once: no Pod is ever seen terminating (with a deletionTimestamp).
        to_kill = [pod for pod in c.pods if _phase(pod) not in (SOFT if last_retry else retain)]
        errors = []
        marked = []
        for pod in to_kill:
            name = pod["metadata"]["name"]
            try:
                self._call("PATCH", path("Pod", c.namespace, name), [
                    {"op": "add", "path": "/metadata/annotations/" + OUT_OF_SYNC_KEY.replace("~", "~0").replace("/", "~1"),
                     "value": "true"}], content_type="application/json-patch+json")
                self._record("patch", "Pod", name)
                marked.append(pod)
            except ApiException as exc:
                if exc.status == 404:
                    marked.append(pod)
                    continue
                errors.append(_reason(exc))
        for pod in marked:
            try:
                self._delete("Pod", pod["metadata"]["name"])
                counts["terminating"] += 1
            except ApiException as exc:
                errors.append(_reason(exc))
                _classify(pod, counts, task_counts)
        if errors:
            self._event(job, "Warning", "FailedDelete", f"Error deleting pods: [{' '.join(errors)}]")
            raise SyncError(f"failed to kill {len(errors)} pods of {len(c.pods)}")
        for key in ("pending", "running", "succeeded", "failed", "terminating", "unknown"):
            status[key] = counts[key]
        status["taskStatusCount"] = _task_status(task_counts)
        if update is not None and update(status):
            _transition(status)
        state_time = (status.get("state") or {}).get("lastTransitionTime")
        if state_time:
            created = datetime.fromisoformat(job["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
            status["runningDuration"] = _go_duration((datetime.fromisoformat(state_time.replace("Z", "+00:00")) - created).total_seconds())
        self._on_job_delete(c)
        status["controlledResources"] = dict(c.tracked.guards)
        job["status"] = _omitempty(status)
        try:
            self._update_status(c, job)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        name = c.podgroup["metadata"]["name"] if c.podgroup else f"{c.name}-{job['metadata']['uid']}"
        if self._delete("PodGroup", name):
            c.podgroup = None

    # -- the plugin hooks ---------------------------------------------------------------------------------

    def _plugins(self, c: _Sync) -> list[Plugin]:
        names = list(c.spec.get("plugins") or {})
        unknown = [n for n in names if n not in VOLCANO_PLUGINS]
        if unknown:
            raise SyncError(f"failed to get plugin {unknown[0]}")
        job, chain = volcano_chain(c.job)
        # As Volcano builds them: a bad argument is logged, and the flags before it are used.
        return list(chain.lineup(job, strict=False).plugins)

    def _on_job_add(self, c: _Sync) -> None:
        guards = c.tracked.guards
        for plugin in self._plugins(c):
            key = f"plugin-{plugin.name}"
            if plugin.name == "hcclrank" or guards.get(key) == plugin.name:
                continue
            if plugin.name == "ssh":
                if not plugin.options["ssh-private-key"]:
                    with self._lock:
                        self._counters.key_pairs += 1
                (secret,) = plugin.resources(None)
                self._create_or_update_data("Secret", _volcano_object(secret), ("data",), compare=("config",))
            elif plugin.name == "svc":
                config_map, *rest = [_volcano_object(o) for o in plugin.resources(None)]
                self._create_or_update_data("ConfigMap", config_map, ("data",))
                for obj in rest:
                    self._create_if_absent(obj)
            guards[key] = plugin.name

    def _on_job_delete(self, c: _Sync) -> None:
        guards, name = c.tracked.guards, c.name
        for plugin in self._plugins(c):
            key = f"plugin-{plugin.name}"
            if plugin.name == "hcclrank" or guards.get(key) != plugin.name:
                continue
            if plugin.name == "ssh":
                self._delete("Secret", f"{name}-ssh")
            elif plugin.name == "svc":
                self._delete("ConfigMap", f"{name}-svc")
                self._delete("Service", name)
            del guards[key]
            if plugin.name == "svc" and not plugin.options["disable-network-policy"]:
                self._delete("NetworkPolicy", name)

    def _create_or_update_data(self, kind: str, obj: Obj, fields: tuple[str, ...], compare: tuple[str, ...] | None = None) -> None:
        """``CreateOrUpdateConfigMap``/``CreateOrUpdateSecret``: create, or replace ``fields`` when
        they differ (a Secret is compared on its ``config`` key only)."""
        current = self._get(kind, obj["metadata"]["name"], obj["metadata"]["namespace"])
        if current is None:
            self._create(kind, obj)
            return
        if compare is not None:
            differs = any((current.get("data") or {}).get(k) != (obj.get("data") or {}).get(k) for k in compare)
        else:
            differs = any(current.get(f) != obj.get(f) for f in fields)
        if differs:
            updated = copy.deepcopy(current)
            for f in fields:
                updated[f] = obj.get(f)
            self._update(kind, updated)

    def _create_if_absent(self, obj: Obj) -> None:
        if self._get(obj["kind"], obj["metadata"]["name"], obj["metadata"]["namespace"]) is None:
            self._create(obj["kind"], obj)


# Helpers: the plugins as Volcano runs them, statuses ---------------------------------------------


def volcano_chain(job_obj: Obj) -> tuple[Job, Chain]:
    """The Job as Volcano's controller sees it (this project's plugins annotation means nothing to
    it) and a chain of Volcano's eight plugins running exactly ``spec.plugins``."""
    raw = copy.deepcopy(job_obj)
    ((raw.get("metadata") or {}).get("annotations") or {}).pop(PLUGINS_ANNOTATION, None)
    return Job.from_object(raw), Chain(_REGISTRY, ChainConfig(volcano_plugins=frozenset(VOLCANO_PLUGINS)))


def _volcano_object(obj: Obj) -> Obj:
    """A plugin object as Volcano makes it: no label (ours marks what the reconciler owns)."""
    out = copy.deepcopy(obj)
    labels = out["metadata"].get("labels") or {}
    labels.pop(MANAGED_BY_LABEL, None)
    if not labels:
        out["metadata"].pop("labels", None)
    return out


def _reason(exc: BaseException) -> str:
    return status_message(exc) if isinstance(exc, ApiException) else str(exc)


def _classify(pod: Obj, counts: Counter[str], task_counts: dict[str, dict[str, int]]) -> None:
    """``classifyAndAddUpPodBaseOnPhase`` and ``calcPodStatus``."""
    phase = _phase(pod)
    counts[{"Pending": "pending", "Running": "running", "Succeeded": "succeeded", "Failed": "failed"}.get(phase, "unknown")] += 1
    task = (pod["metadata"].get("annotations") or {}).get(TASK_SPEC_KEY)
    if task is not None:
        by_phase = task_counts.setdefault(task, {})
        key = phase if phase in ("Pending", "Running", "Succeeded", "Failed") else "Unknown"
        by_phase[key] = by_phase.get(key, 0) + 1


def _task_status(task_counts: dict[str, dict[str, int]]) -> Obj:
    return {task: {"phase": phases} for task, phases in task_counts.items()}


def _transition(status: Obj) -> None:
    """A phase change's bookkeeping: ``lastTransitionTime`` and the condition (one per phase, last)."""
    now = _now()
    state = dict(status.get("state") or {})
    state["lastTransitionTime"] = now
    status["state"] = state
    conditions = [c for c in status.get("conditions") or [] if c.get("status") != state.get("phase")]
    status["conditions"] = [*conditions, {"status": state.get("phase"), "lastTransitionTime": now}]


def _set_phase(status: Obj, phase: str) -> None:
    status["state"] = {**(status.get("state") or {}), "phase": phase}


def _to(phase: str) -> UpdateStatus:
    def update(status: Obj) -> bool:
        _set_phase(status, phase)
        return True
    return update


def _restarted(status: Obj) -> bool:
    status["retryCount"] = int(status.get("retryCount") or 0) + 1
    _set_phase(status, "Restarting")
    return True


def _when_gone(phase: str) -> UpdateStatus:
    """Terminating: the end phase once no Pod is alive."""
    def update(status: Obj) -> bool:
        if status.get("terminating") or status.get("pending") or status.get("running"):
            return False
        _set_phase(status, phase)
        return True
    return update


def _total(spec: Obj) -> int:
    return sum(int(t.get("replicas") or 0) for t in spec.get("tasks") or [])


def _min_task_member(task: Obj) -> int:
    if task.get("minAvailable") is not None:
        return int(task["minAvailable"])
    return int(task.get("replicas") or 0)


def _pending_update(spec: Obj) -> UpdateStatus:
    def update(status: Obj) -> bool:
        started = int(status.get("running") or 0) + int(status.get("succeeded") or 0) + int(status.get("failed") or 0)
        if int(spec.get("minAvailable") or 0) <= started:
            _set_phase(status, "Running")
            return True
        return False
    return update


def _running_update(spec: Obj) -> UpdateStatus:
    def update(status: Obj) -> bool:
        replicas = _total(spec)
        succeeded, failed = int(status.get("succeeded") or 0), int(status.get("failed") or 0)
        if replicas == 0 or succeeded + failed != replicas:
            return False
        _set_phase(status, "Completed" if succeeded >= int(spec.get("minAvailable") or 0) else "Failed")
        return True
    return update


def _restarting_update(spec: Obj) -> UpdateStatus:
    def update(status: Obj) -> bool:
        if _total(spec) - int(status.get("terminating") or 0) >= int(status.get("minAvailable") or 0):
            _set_phase(status, "Pending")
            return True
        return False
    return update
