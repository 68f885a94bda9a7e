"""The contract every plugin keeps, built-in or third-party.

A plugin is a class with a ``name``, its Go-style ``flags``, the plugins it ``requires`` (added like
Volcano's job admission adds svc and ssh), and three hooks:

* ``check()``: job-level validation, run at ``/validate`` and before every Pod; raises
  :class:`PluginError`, returns warnings;
* ``mutate(ctx)``: change one Pod of the job in place, idempotently;
* ``resources(existing)``: the side objects the job needs (ConfigMaps, Services, ...), as the reconciler
  will create them.

One instance is made per job and argument list; it holds no state between calls and does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from . import names
from .errors import FlagError, PluginError
from .flags import Flag, parse_flags, shown
from .job import Job, Task
from .pod import Obj, containers, mount_conflict, port_conflict, task_index

DEFAULT_HOSTS_ENV_LIMIT = 100_000
# Live side objects the reconciler found for a job, by (kind, name); only ones this project manages.
# The reconciler does not hold long values of their ``data`` (host files, SSH keys): such a value
# is a :class:`Digest` in its place. A plugin that keeps a live value returns it as it is.
Existing = Mapping[tuple[str, str], Obj]


class Digest(str):
    """Stands in ``existing`` for a long ``data`` value the reconciler does not keep in memory:
    equal to the digest of the same value, never to the value. Returned as it is in a plugin's
    object, it means "keep what is there"; the reconciler puts the value back before it writes."""

    __slots__ = ()


@dataclass(frozen=True)
class Settings:
    """Server-wide options that shape the chain (the webhook's configuration sets them)."""

    # Longest VC_<TASK>_HOSTS value injected; None for no limit below the kernel's
    # (budget.ENV_STRING_LIMIT), which always applies.
    hosts_env_limit: int | None = DEFAULT_HOSTS_ENV_LIMIT


@dataclass
class PodContext:
    """One Pod being wired: the Pod (mutated in place), its job and task, and collected warnings."""

    job: Job
    pod: Obj
    task: Task
    settings: Settings = field(default_factory=Settings)
    warnings: list[str] = field(default_factory=list)
    injected_init: frozenset[str] = frozenset()
    # Size of the Pod as it came in (JSON bytes), for plugins that weigh what they add against
    # budget.STORE_LIMIT; 0 when unknown.
    input_bytes: int = 0

    def all_containers(self, *, init_first: bool = False) -> Iterator[Obj]:
        """Regular then init containers (init first for mpi), leaving out init containers another
        plugin of the chain injects (pytorch's ``wait-for-master``). Volcano's random plugin order
        gives those containers other plugins' changes only sometimes; leaving them out keeps the
        chain idempotent and accepts Pods wired in either order (docs/volcano-behaviour.md#plugin-order)."""
        for _, container in self.located_containers(init_first=init_first):
            yield container

    def located_containers(self, *, init_first: bool = False) -> Iterator[tuple[str, Obj]]:
        """:meth:`all_containers` with each container's field path (``spec.containers[0]``), for errors."""
        init = [
            (f"spec.initContainers[{i}]", c)
            for i, c in enumerate(containers(self.pod, init=True))
            if c.get("name") not in self.injected_init
        ]
        regular = [(f"spec.containers[{i}]", c) for i, c in enumerate(containers(self.pod))]
        yield from (init + regular) if init_first else (regular + init)

    def index(self, plugin: str) -> str:
        """The Pod's index within its task as a string (docs/volcano-behaviour.md#task-and-index), or an error naming ``plugin``."""
        found = task_index(self.pod)
        if found is None:
            raise PluginError(
                self.job.key,
                plugin,
                "pod index",
                f"cannot find the index of Pod {self.pod_name!r}: no volcano.sh/task-index label or "
                "annotation, and the name does not end in -<index>",
            )
        return found

    def index_number(self, plugin: str) -> int:
        """The Pod's index as a non-negative integer, or an error naming ``plugin``."""
        text = self.index(plugin)
        if not text.isascii() or not text.isdigit():
            raise PluginError(self.job.key, plugin, "pod index", f"index {text!r} of Pod {self.pod_name!r} is not a number")
        return int(text)

    @property
    def pod_name(self) -> str:
        return str((self.pod.get("metadata") or {}).get("name") or "")


class Mount(NamedTuple):
    """A volume a plugin mounts at a fixed path in the containers it wires, and the argument that
    chose the path (for errors)."""

    path: str
    volume: str
    field: str


class Plugin:
    """Base class for plugins. Subclasses set ``name``, ``flags`` and override the hooks they need."""

    name: ClassVar[str] = ""
    flags: ClassVar[tuple[Flag, ...]] = ()
    requires: ClassVar[tuple[str, ...]] = ()
    # Every plugin the chain runs for this job, with its arguments (server defaults and dependencies
    # included); the chain sets it. None when a plugin is built on its own.
    peers: Mapping[str, Sequence[str]] | None = None

    def __init__(self, job: Job, args: Sequence[str], settings: Settings | None = None) -> None:
        self.job = job
        self.settings = settings or Settings()
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise PluginError(job.key, self.name, "arguments", f"must be a list of strings, got {shown(args)}")
        try:
            self.options: dict[str, Any] = parse_flags(self.flags, args)
        except FlagError as exc:
            raise PluginError(job.key, self.name, exc.flag or "arguments", exc.reason) from None

    def check(self) -> list[str]:
        """Validate the job for this plugin; raise :class:`PluginError`, return warnings."""
        return []

    def mutate(self, ctx: PodContext) -> None:
        """Change ``ctx.pod`` as Volcano's ``OnPodCreate`` would, idempotently."""

    def injected_init_containers(self) -> frozenset[str]:
        """Names of init containers this plugin adds; other plugins leave them alone."""
        return frozenset()

    def mounts(self) -> list[Mount]:
        """The volumes this plugin mounts and where; the chain refuses two plugins that mount
        different volumes at one path (the API server would reject every Pod)."""
        return []

    def resources(self, existing: Existing | None = None) -> list[Obj]:
        """The side objects this plugin wants for the job (Volcano's ``OnJobAdd``). ``existing``
        holds the live objects of the same job, for state that must survive (SSH keys)."""
        return []

    # Helpers shared by the plugins.

    def error(self, field: str, reason: str) -> PluginError:
        return PluginError(self.job.key, self.name, field, reason)

    def warning(self, text: str) -> str:
        return f"job {self.job.key}: plugin {self.name}: {text}"

    def require_name(self, rule: str, value: str, what: str) -> None:
        """Raise unless ``value`` satisfies the naming ``rule`` (``label``, ``dns1035`` or ``subdomain``)."""
        check = {"label": names.dns1123_label, "dns1035": names.dns1035_label, "subdomain": names.dns1123_subdomain}[rule]
        problem = check(value)
        if problem:
            raise self.error(what, problem)

    def template_containers(self, task: Task, *, init: bool = True) -> Iterator[tuple[str, Obj]]:
        """A task template's containers (and init containers), each with its field path."""
        spec = task.template.get("spec") or {}
        where = f"spec.tasks[{task.position}].template.spec"
        for key in ("containers", "initContainers") if init else ("containers",):
            found = spec.get(key)
            for i, container in enumerate(found if isinstance(found, list) else []):
                if isinstance(container, dict):
                    yield f"{where}.{key}[{i}]", container

    def require_mount_free(self, tasks: Iterable[Task], mount: Mount, *, init: bool = True) -> None:
        """At ``check()``: no container of these tasks' templates mounts another volume at
        ``mount.path`` (the same rule :func:`pod.ensure_mount` applies to each Pod)."""
        for task in tasks:
            for where, container in self.template_containers(task, init=init):
                problem = mount_conflict(container, mount.volume, mount.path)
                if problem and mount.field.startswith("-"):  # the path is the argument's choice
                    raise self.error(mount.field, f"{where}: {problem}")
                if problem:
                    raise self.error(f"{where}.volumeMounts", problem)

    def require_port_free(self, tasks: Iterable[Task], name: str, number: int, *, init: bool = False) -> None:
        """At ``check()``: the port ``name``/``number`` can be added to every container of these
        tasks' templates (the same rule :func:`pod.ensure_port` applies to each Pod)."""
        for task in tasks:
            for where, container in self.template_containers(task, init=init):
                problem = port_conflict(container, name, number)
                if problem:
                    raise self.error(f"{where}.ports", problem)

    def require_hostnames(self, task: Task) -> None:
        """Every hostname and subdomain the task's Pods will get must be DNS-1123 labels."""
        if task.hostname:
            self.require_name("label", task.hostname, f"spec.tasks[{task.position}].template.spec.hostname")
        elif task.replicas:
            # The longest pod name of the task is the one with the highest index.
            self.require_name("label", self.job.pod_name(task.name, task.replicas - 1), f"hostname of task {task.name!r}")
        self.require_name("label", task.subdomain or self.job.name, f"subdomain of task {task.name!r}")
