"""The contract every plugin keeps, built-in or third-party (docs/plugins.md#third-party-plugins): the
chain builds one :class:`Plugin` per job and calls its hooks; an instance holds no state between
calls and does no I/O."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, NamedTuple

from .errors import FlagError, PluginError
from .flags import Flag, parse_flags, shown
from .job import Job, Task
from .pod import Obj, containers

DEFAULT_HOSTS_ENV_LIMIT = 100_000
# The job's live side objects this project manages, by (kind, name). A long ``data`` value may be a
# :class:`Digest` in its place: a plugin that keeps a live value returns it as it is.
Existing = Mapping[tuple[str, str], Obj]


class Digest(str):
    """A long ``data`` value of ``existing`` that the reconciler keeps only as a digest; returned as it
    is, it means "keep what is there"."""

    __slots__ = ()


@dataclass(frozen=True)
class Settings:
    """Server-wide options that shape the chain (the webhook's configuration sets them)."""

    # Longest VC_<TASK>_HOSTS value injected; None for no limit below the kernel's
    # (budget.ENV_STRING_LIMIT), which always applies.
    hosts_env_limit: int | None = DEFAULT_HOSTS_ENV_LIMIT
    # The cluster's DNS domain (kubelet's --cluster-domain) the host names of the plugins we run are
    # qualified in; None keeps Volcano's short ones, as its controller always does (as_volcano).
    cluster_domain: str | None = None
    # Where our plugins' variables go in a container's env when the job's annotation does not say:
    # after its own, as Volcano appends, or first, so that $(NAME) in its own expands.
    env_placement: Literal["last", "first"] = "last"

    def as_volcano(self) -> Settings:
        """These settings as they apply to a plugin Volcano's controller runs: its host names are
        Volcano's, short, whatever ``cluster_domain`` says."""
        return replace(self, cluster_domain=None) if self.cluster_domain else self


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
    # The plugins that wrote host names into the Pod (names_hosts).
    hosts_named_by: set[str] = field(default_factory=set)

    def names_hosts(self, plugin: str) -> None:
        """Say that ``plugin`` has written host names of the job into the Pod: if it is one the
        chain runs (not Volcano's controller) and the Pod is on the host's network with DNS that
        would not resolve them, the chain gives it ``dnsPolicy: ClusterFirstWithHostNet``."""
        self.hosts_named_by.add(plugin)

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
        found = self.job.index_of(self.pod)
        if found is None:
            raise PluginError(
                self.job.key,
                plugin,
                "pod index",
                f"cannot find the index of Pod {self.pod_name!r}: {self.job.index_sources}",
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
    """Base class for plugins. Subclasses set ``name``, ``flags`` and override the hooks they need.

    ``peers`` is every plugin the chain runs for the job, with its arguments (server defaults and
    dependencies included), this one among them; built on its own, a plugin knows only the job's
    ``spec.plugins``. Read a peer's arguments with :func:`~.helpers.peer_options`."""

    name: ClassVar[str] = ""
    flags: ClassVar[tuple[Flag, ...]] = ()
    requires: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self, job: Job, args: Sequence[str], settings: Settings | None = None, *, peers: Mapping[str, Sequence[str]] | None = None
    ) -> None:
        self.job = job
        self.settings = settings or Settings()
        self.peers: Mapping[str, Sequence[str]] = job.plugins if peers is None else peers
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
