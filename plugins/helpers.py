"""What plugins use besides the contract, as plain functions of the plugin so that :class:`~.base.Plugin`
stays what the chain calls: errors naming the job, ``check()``-time template rules, a peer's arguments."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from . import names
from .base import Mount, Plugin
from .budget import Hosts, task_hosts
from .errors import FlagError, PluginError, did_you_mean
from .flags import parse_flags
from .job import Task
from .pod import Obj, containers, mount_conflict, port_conflict, spec


def plugin_error(plugin: Plugin, field: str, reason: str) -> PluginError:
    """An error naming ``plugin``'s job, the plugin and the argument or field at fault."""
    return PluginError(plugin.job.key, plugin.name, field, reason)


def reject(plugin: Plugin, field: str, problem: str | None) -> None:
    """Raise :func:`plugin_error` on ``field`` when there is a ``problem`` (what ``pod.ensure_*`` and the naming rules return)."""
    if problem:
        raise plugin_error(plugin, field, problem)


def plugin_warning(plugin: Plugin, text: str) -> str:
    return f"job {plugin.job.key}: plugin {plugin.name}: {text}"


def task_hint(plugin: Plugin, name: str) -> str:
    """``"; did you mean 'worker'?"`` when ``name``, a task the job lacks, is close to one it has."""
    return did_you_mean(name, [t.name for t in plugin.job.tasks], repr)


def require_task(plugin: Plugin, flag: str, name: str, about: str = "") -> Task:
    """The job's task ``name``; else an error on ``flag``, after ``about``, listing the job's tasks."""
    task = plugin.job.task(name)
    if task is None:
        known = ", ".join(t.name for t in plugin.job.tasks)
        raise plugin_error(plugin, flag, f"{about}the job has no task {name!r}{task_hint(plugin, name)} (tasks: {known})")
    return task


def name_taken(name: str, what: str) -> str:
    """Why the container ``name`` (``what`` it is) cannot be added where a container has that name."""
    return (f"a container is already named {name!r}, {what}; the API server requires container names to be unique "
            "across containers and init containers")


def add_init_container(plugin: Plugin, pod: Obj, wanted: Obj, taken: str, *, first: bool = False,
                       same: Callable[[Obj, Obj], bool] | None = None) -> None:
    """Add ``wanted`` to the Pod's init containers (``first``, or last) unless one of its name is there
    (replaced where ``same`` says it differs); a regular container of that name is refused: ``taken``."""
    for i, container in enumerate(containers(pod)):
        if container.get("name") == wanted["name"]:
            raise plugin_error(plugin, f"spec.containers[{i}].name", taken)
    init = spec(pod).setdefault("initContainers", [])
    for i, container in enumerate(init):
        if isinstance(container, dict) and container.get("name") == wanted["name"]:
            if same is not None and not same(container, wanted):
                init[i] = wanted
            return
    init.insert(0 if first else len(init), wanted)


def require_name(plugin: Plugin, rule: str, value: str, what: str) -> None:
    """Raise unless ``value`` satisfies the naming ``rule`` (``label``, ``dns1035`` or ``subdomain``)."""
    check = {"label": names.dns1123_label, "dns1035": names.dns1035_label, "subdomain": names.dns1123_subdomain}[rule]
    reject(plugin, what, check(value))


def template_containers(task: Task, *, init: bool = True) -> Iterator[tuple[str, Obj]]:
    """A task template's containers (and init containers), each with its field path."""
    spec = task.template.get("spec") or {}
    where = f"{task.template_path}.spec"
    for key in ("containers", "initContainers") if init else ("containers",):
        found = spec.get(key)
        for i, container in enumerate(found if isinstance(found, list) else []):
            if isinstance(container, dict):
                yield f"{where}.{key}[{i}]", container


def require_mount_free(plugin: Plugin, tasks: Iterable[Task], mount: Mount, *, init: bool = True) -> None:
    """At ``check()``: no container of these tasks' templates mounts another volume at
    ``mount.path`` (the same rule :func:`pod.ensure_mount` applies to each Pod)."""
    for task in tasks:
        for where, container in template_containers(task, init=init):
            problem = mount_conflict(container, mount.volume, mount.path)
            if problem and mount.field.startswith("-"):  # the path is the argument's choice
                raise plugin_error(plugin, mount.field, f"{where}: {problem}")
            reject(plugin, f"{where}.volumeMounts", problem)


def require_port_free(plugin: Plugin, tasks: Iterable[Task], name: str, number: int, *, init: bool = False) -> None:
    """At ``check()``: the port ``name``/``number`` can be added to every container of these
    tasks' templates (the same rule :func:`pod.ensure_port` applies to each Pod)."""
    for task in tasks:
        for where, container in template_containers(task, init=init):
            reject(plugin, f"{where}.ports", port_conflict(container, name, number))


def require_hostnames(plugin: Plugin, task: Task) -> None:
    """Every hostname and subdomain the task's Pods will get must be DNS-1123 labels, and, fully
    qualified (``cluster_domain``), every host name a DNS name of at most 253 characters."""
    job = plugin.job
    if task.hostname:
        require_name(plugin, "label", task.hostname, f"{task.template_path}.spec.hostname")
    elif task.replicas:
        # The longest pod name of the task is the one with the highest index.
        require_name(plugin, "label", job.pod_name(task.name, task.replicas - 1), f"hostname of task {task.name!r}")
    require_name(plugin, "label", task.subdomain or job.name, f"subdomain of task {task.name!r}")
    if plugin.settings.cluster_domain and task.replicas:
        longest = domain_name(plugin, task, task.replicas - 1)
        if len(longest) > names.SUBDOMAIN_MAX:
            raise plugin_error(plugin, f"host names of task {task.name!r}",
                               f"{longest!r} is {len(longest)} characters, over the {names.SUBDOMAIN_MAX} of a DNS name "
                               f"(fully qualified in the cluster domain {plugin.settings.cluster_domain!r})")


# Host names as the plugin writes them: fully qualified when the chain runs it with a cluster_domain
# (Job.host_suffix), short otherwise. A plugin that writes host names takes them from here.


def host_suffix(plugin: Plugin, task: Task) -> str:
    """What follows a host label of ``task`` in the names ``plugin`` writes (``Job.host_suffix``)."""
    return plugin.job.host_suffix(task, plugin.settings.cluster_domain)


def domain_name(plugin: Plugin, task: Task, index: int) -> str:
    """Member ``index`` of ``task`` by the name ``plugin`` writes (``Job.domain_name``)."""
    return plugin.job.domain_name(task, index, plugin.settings.cluster_domain)


def host_names(plugin: Plugin, task: Task) -> list[str]:
    """The names of ``task``'s Pods as ``plugin`` lists them (``Job.host_names``); size them first
    with :func:`hosts_size`."""
    return plugin.job.host_names(task, plugin.settings.cluster_domain)


def hosts_size(plugin: Plugin, task: Task, *, every_replica: bool = False) -> Hosts:
    """The sizes of :func:`host_names` (or of one name per replica, ``every_replica``), from counts."""
    return task_hosts(plugin.job, task, every_replica=every_replica, cluster_domain=plugin.settings.cluster_domain)


def sole_task(plugin: Plugin, master: str, worker: str) -> str | None:
    """The job's only task when neither ``master`` nor ``worker`` names one of its tasks (an Indexed
    Job's, docs/workloads.md): master and workers alike, its Pod 0 the master. None otherwise, and
    when the two name the same task (an error of their own)."""
    tasks = plugin.job.tasks
    if master != worker and len(tasks) == 1 and plugin.job.task(master) is None and plugin.job.task(worker) is None:
        return tasks[0].name
    return None


def peer_options(plugin: Plugin, peer: type[Plugin], *, field: str = "", reason: str = "cannot read its arguments") -> dict[str, Any] | None:
    """``peer``'s arguments, parsed, as the chain runs it beside ``plugin`` for the job; None when
    it does not run. Arguments that do not parse are ``plugin``'s error, on ``field`` (default
    ``plugin <peer>``)."""
    args = plugin.peers.get(peer.name, ...)
    if args is ...:
        return None
    try:
        return parse_flags(peer.flags, list(args or []))
    except (FlagError, TypeError) as exc:
        raise plugin_error(plugin, field or f"plugin {peer.name}", f"{reason}: {exc}") from None


def reject_reserved_env(plugin: Plugin, reserved: Callable[[str], bool], why: str, tasks: Iterable[Task] | None = None) -> None:
    """Raise, naming the template field, when a regular container of ``tasks`` (every task's by
    default) sets a variable name ``reserved`` says the plugin owns."""
    for task in plugin.job.tasks if tasks is None else tasks:
        for i, container in enumerate(task.containers):
            env = container.get("env") if isinstance(container, Mapping) else None
            for j, entry in enumerate(env if isinstance(env, list) else []):
                name = entry.get("name") if isinstance(entry, Mapping) else None
                if isinstance(name, str) and reserved(name):
                    raise plugin_error(plugin, f"{task.template_path}.spec.containers[{i}].env[{j}]",
                                       f"{name} is reserved: {why}; remove it from the template and use the plugin's flags")
