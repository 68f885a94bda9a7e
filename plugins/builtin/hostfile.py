"""``hostfile``: an MPI or DeepSpeed host file of the job's Pods in a ConfigMap, mounted where the
launcher looks (docs/volcano-behaviour.md#hostfile). One over the ConfigMap's 1 MiB refuses the job:
a launcher given part of it would start a smaller job without a word."""

from __future__ import annotations

from functools import cached_property

from ..base import Existing, Mount, Plugin, PodContext
from ..budget import DATA_LIMIT, DATA_LIMIT_TEXT, digits
from ..flags import Flag
from ..helpers import host_names, hosts_size, plugin_error, reject, require_mount_free, require_name, sole_task, task_hint
from ..job import Task
from ..kinds import CONFIG_MAP
from ..pod import Obj, ensure_envs, ensure_mount, ensure_volume
from .quantity import gpu_limit

FORMATS = ("openmpi", "intel", "mpich", "deepspeed")
DEFAULT_PATH = "/etc/mpi/hostfile"
DEEPSPEED_PATH = "/job/hostfile"
KEY = "hostfile"
ENV: dict[str, tuple[tuple[str, str | None], ...]] = {
    # None stands for the mount path.
    "openmpi": (("OMPI_MCA_orte_default_hostfile", None), ("OMPI_MCA_orte_keep_fqdn_hostnames", "true")),
    "intel": (("I_MPI_HYDRA_HOST_FILE", None),),
    "mpich": (("HYDRA_HOST_FILE", None),),
    "deepspeed": (),
}


def config_map_name(job_name: str) -> str:
    return f"{job_name}-hostfile"


class HostfilePlugin(Plugin):
    name = "hostfile"
    requires = ("svc",)
    flags = (
        Flag("worker", "string", "worker", "name of the worker task"),
        Flag("include-master", "bool", False, "list the master task's Pods too, first"),
        Flag("master", "string", "master", "name of the master (launcher) task"),
        Flag("format", "string", "openmpi", "openmpi, intel, mpich or deepspeed"),
        Flag("slots", "string", "auto", "slots per host: auto (GPU limit of the task's first container, else 1) or a number"),
        Flag("path", "string", None, f"where containers find the file (default {DEFAULT_PATH}; {DEEPSPEED_PATH} for deepspeed)"),
    )

    @property
    def path(self) -> str:
        path = self.options["path"]
        if path is None:
            return DEEPSPEED_PATH if self.options["format"] == "deepspeed" else DEFAULT_PATH
        return str(path)

    def check(self) -> list[str]:
        fmt = self.options["format"]
        if fmt not in FORMATS:
            raise plugin_error(self, "--format", f"must be one of {', '.join(FORMATS)}, got {fmt!r}")
        slots = self.options["slots"]
        if slots != "auto" and not (slots.isascii() and slots.isdigit() and int(slots) >= 1):
            raise plugin_error(self, "--slots", f"must be auto or a positive integer, got {slots!r}")
        path = self.path
        if not path.startswith("/") or path.endswith("/") or ".." in path.split("/") or ":" in path:
            raise plugin_error(self, "--path", f"must be an absolute path to a file (no trailing '/', '..' or ':'), got {path!r}")
        if self.options["master"] == self.options["worker"]:
            raise plugin_error(self, "--worker", f"names the master task {self.options['master']!r}; master and worker must be different tasks")
        master, worker = self._roles
        if self.job.task(master) is None:
            raise plugin_error(self, "--master", f"the job has no task {master!r} (the launcher that reads the host file){task_hint(self, master)}")
        if self.job.task(worker) is None:
            raise plugin_error(self, "--worker", f"the job has no task {worker!r} (the Pods the host file lists){task_hint(self, worker)}")
        require_name(self, "label", config_map_name(self.job.name), "volume name")
        require_name(self, "subdomain", config_map_name(self.job.name), "ConfigMap name")
        for task in self._listed():
            self._slots(task)  # a malformed GPU limit fails here, not in the reconciler
        # The tasks whose Pods mount the file: master and worker.
        require_mount_free(self, [t for t in map(self.job.task, dict.fromkeys(self._roles)) if t is not None], self.mounts()[0])
        size = self.hostfile_size()
        if size > DATA_LIMIT:
            largest = max(self._listed(), key=lambda t: t.replicas)
            raise plugin_error(
                self,
                largest.replicas_path,
                f"the host file would be {size} bytes ({sum(hosts_size(self, t).count for t in self._listed())} hosts), "
                f"over {DATA_LIMIT_TEXT}; the ConfigMap {config_map_name(self.job.name)!r} cannot hold it",
            )
        return []

    def mounts(self) -> list[Mount]:
        return [Mount(self.path, config_map_name(self.job.name), "--path")]

    @cached_property
    def _roles(self) -> tuple[str, str]:
        """The master and worker task names; one name twice when one task is both."""
        master, worker = self.options["master"], self.options["worker"]
        sole = sole_task(self, master, worker)
        return (sole, sole) if sole is not None else (master, worker)

    def _separator(self) -> str:
        return ":" if self.options["format"] in ("intel", "mpich") else " slots="

    def hostfile_size(self) -> int:
        """``len(self.hostfile)`` from counts alone: per host ``<host><separator><slots>\n``."""
        sep = len(self._separator())
        return sum(hosts_size(self, t).joined(sep=0, each=sep + digits(self._slots(t)) + 1) for t in self._listed())

    def _listed(self) -> list[Task]:
        master, worker = self._roles
        names = dict.fromkeys(([master] if self.options["include-master"] else []) + [worker])
        return [task for task in map(self.job.task, names) if task is not None]

    def _slots(self, task: Task) -> int:
        if self.options["slots"] != "auto":
            return int(self.options["slots"])
        first = task.containers[0] if task.containers else {}
        try:
            gpus = gpu_limit(first, f"{task.template_path}.spec.containers[0]")
        except ValueError as exc:
            raise plugin_error(self, "--slots=auto", str(exc)) from None
        return gpus or 1

    @cached_property
    def hostfile(self) -> str:
        """The file: one ``"\\n"``-terminated line per Pod, master task first when included; as
        long as the replicas, so check() has sized it first."""
        sep = self._separator()
        lines: list[str] = []
        for task in self._listed():
            slots = self._slots(task)
            lines.extend(f"{host}{sep}{slots}\n" for host in host_names(self, task))
        return "".join(lines)

    def mutate(self, ctx: PodContext) -> None:
        master, worker = self._roles
        is_master = ctx.task.name == master
        if not is_master and ctx.task.name != worker:
            return
        name = config_map_name(self.job.name)
        reject(self, "spec.volumes", ensure_volume(ctx.pod, {"name": name, "configMap": {"name": name}}))
        ctx.names_hosts(self.name)  # the file it mounts
        path = self.path
        env: list[tuple[str, str | None, Obj | None]] = [(var, path if value is None else value, None) for var, value in ENV[self.options["format"]]] if is_master else []
        for where, container in ctx.located_containers():
            problem = ensure_mount(container, {"name": name, "mountPath": path, "subPath": KEY, "readOnly": True})
            if problem:
                raise plugin_error(self, "--path", f"{where}: {problem}")
            if env:
                ensure_envs(container, env)

    def resources(self, existing: Existing | None = None) -> list[Obj]:
        if self.hostfile_size() > DATA_LIMIT:
            self.check()  # raises with the size, before the file is built
        return [self.job.side_object(CONFIG_MAP, config_map_name(self.job.name), data={KEY: self.hostfile})]
