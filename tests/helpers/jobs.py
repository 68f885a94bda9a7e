"""Volcano Jobs for the tests, built in one place: as a user writes them (:func:`volcano_job`), from
examples/jobs/, with our plugins annotation, the owner reference Volcano and the reconciler set,
and as YAML files."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

API_VERSION = "batch.volcano.sh/v1alpha1"
PLUGINS_ANNOTATION = "volcano-job-webhook/plugins"
IMAGE = "busybox:1.36.1"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"

Obj = dict[str, Any]
TaskSpec = tuple[str, int] | tuple[str, int, Mapping[str, Any]] | Mapping[str, Any]

# The init containers our plugins add, each with a job whose Pod gets it: plugins, tasks, the task
# whose Pod is made, the init container's name (docs/volcano-behaviour.md#our-init-containers-resources).
INIT_CONTAINER_CASES = {
    "waitfor": ({"waitfor": ["--tasks=worker"]}, [("master", 1), ("worker", 2)], "master", "wait-for-tasks"),
    "svc past the ConfigMap's limit": ({"svc": []}, [("w", 80_000)], "w", "volcano-svc-hosts"),
}


def task(name: str, replicas: int = 1, *, image: str = IMAGE, container: str = "main", pod: Mapping[str, Any] | None = None,
         template: Mapping[str, Any] | None = None, **fields: Any) -> Obj:
    """One entry of ``spec.tasks``: Pods of one container ``container`` running ``image``, with the
    Pod-spec fields ``pod`` (``containers`` among them replaces the one), or the whole ``template``;
    ``fields`` are more fields of the task (``minAvailable``, ``policies``...)."""
    if template is None:
        template = {"spec": {"containers": [{"name": container, "image": image}], **(pod or {})}}
    return {"name": name, "replicas": replicas, "template": dict(template), **fields}


def volcano_job(name: str = "demo", *, tasks: Iterable[TaskSpec] = (("master", 1), ("worker", 2)),
                plugins: Mapping[str, list[str]] | None = None, annotation: Mapping[str, list[str]] | None = None,
                namespace: str | None = "default", uid: str | None = None, image: str = IMAGE, container: str = "main",
                pod: Mapping[str, Any] | None = None, status: Mapping[str, Any] | None = None, **spec: Any) -> Obj:
    """A Volcano Job. ``plugins`` None leaves ``spec.plugins`` out; ``annotation`` names plugins in
    ours; ``namespace`` and ``uid`` None leave them out (an API server fills them in); ``image``,
    ``container`` and ``pod`` are every pair-given task's (see :func:`task`); ``spec`` more fields of
    the Job's spec (``minAvailable``, ``queue``, ``schedulerName``...)."""
    metadata: Obj = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if uid is not None:
        metadata["uid"] = uid
    built_tasks = []
    for entry in tasks:
        if isinstance(entry, Mapping):
            built_tasks.append(dict(entry))
        else:
            task_name, replicas, *more = entry
            built_tasks.append(task(task_name, replicas, image=image, container=container, pod={**(pod or {}), **(more[0] if more else {})}))
    job_spec: Obj = dict(spec)
    if plugins is not None:
        job_spec["plugins"] = dict(plugins)
    job_spec["tasks"] = built_tasks
    job: Obj = {"apiVersion": API_VERSION, "kind": "Job", "metadata": metadata, "spec": job_spec}
    if annotation is not None:
        annotate(job, annotation)
    if status is not None:
        job["status"] = dict(status)
    return job


def annotate(job: Obj, plugins: Mapping[str, list[str]]) -> Obj:
    """``job`` with ``plugins`` named in our annotation (the job itself, changed)."""
    job["metadata"].setdefault("annotations", {})[PLUGINS_ANNOTATION] = json.dumps(plugins)
    return job


def set_plugin_arg(job: Obj, plugin: str, flag: str, value: object) -> None:
    """Give ``plugin`` ``--flag=value`` in the job's plugins annotation, in place of any ``--flag`` it had."""
    plugins = json.loads(job["metadata"]["annotations"][PLUGINS_ANNOTATION])
    plugins[plugin] = [a for a in plugins[plugin] if not a.startswith(f"--{flag}")] + [f"--{flag}={value}"]
    annotate(job, plugins)


def annotated(job: Obj) -> Obj:
    """``job`` with its plugins named in our annotation instead of ``spec.plugins``, as a job beside
    Volcano's own controller names the plugins we run (docs/install.md#who-runs-what)."""
    return annotate(job, job["spec"].pop("plugins"))


def example_job(name: str, namespace: str = "default") -> Obj:
    """``examples/jobs/<name>-job.yaml`` as a client creates it in ``namespace`` (the file names no
    uid: the API server assigns one)."""
    job: Obj = yaml.safe_load((EXAMPLES / f"{name}-job.yaml").read_text(encoding="utf-8"))
    job["metadata"]["namespace"] = namespace
    return job


def owner_reference(name: str, uid: str, *, controller: bool = True) -> Obj:
    """A Job as the owner of something made for it (``blockOwnerDeletion``, as Volcano sets it)."""
    return {"apiVersion": API_VERSION, "kind": "Job", "name": name, "uid": uid, "controller": controller, "blockOwnerDeletion": True}


def job_owner(job: Mapping[str, Any]) -> Obj:
    """The controller reference to ``job`` that Volcano's controller and the reconciler set."""
    return owner_reference(job["metadata"]["name"], job["metadata"]["uid"])


def jobs_yaml(*jobs: Mapping[str, Any]) -> str:
    return "".join("---\n" + yaml.safe_dump(dict(job), sort_keys=False) for job in jobs)


def scheduled_job(name: str, **job: Any) -> Obj:
    """A Job as Volcano's scheduler and controller run it, named only (the client's namespace is
    its): queue ``default``, its three Pods (master 1, worker 2) scheduled as one gang, each sleeping
    an hour and never restarted by the kubelet; ``job`` as :func:`volcano_job`'s keywords."""
    sleeper = {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}], "restartPolicy": "Never"}
    return volcano_job(name, **{"namespace": None, "pod": sleeper, "schedulerName": "volcano", "minAvailable": 3, "queue": "default", **job})


def minimal_job(name: str, namespace: str | None = None, replicas: int = 1) -> Obj:
    """The least a jobs file holds that a job source takes: a name and one task, no Pod template."""
    return volcano_job(name, namespace=namespace, tasks=[{"name": "w", "replicas": replicas}])


def many_jobs_yaml(count: int) -> str:
    """A jobs file of ``count`` minimal jobs, ``bulk-0`` on (2,000 take about half a second to parse)."""
    return jobs_yaml(*(minimal_job(f"bulk-{i}") for i in range(count)))


def alias_bomb_yaml(levels: int = 9) -> str:
    """A Job file whose YAML aliases expand to 9**levels strings ("billion laughs")."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "kind: Job\nmetadata: {name: bomb}\nspec:\n  " + "\n  ".join(lines) + "\n"


async def loaded(source: Any) -> None:
    """Wait until a DirectoryJobSource has read its files as they are now: its look under way, or a new one."""
    look, _ = source._schedule(force=True)
    if look is not None:
        await asyncio.wrap_future(look)
