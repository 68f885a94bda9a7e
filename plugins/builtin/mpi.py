"""``mpi``: the launcher's ``MPI_HOST`` and the MPI port (docs/volcano-behaviour.md#mpi). An ``MPI_HOST``
over one environment string is left out with a warning, not refused: no ``mpirun --host`` could take
it either, and svc's ``/etc/volcano/<worker>.host`` lists the same hosts."""

from __future__ import annotations

from functools import cached_property

from ..base import Plugin, PodContext
from ..budget import ENV_LIMIT_TEXT, env_value_limit
from ..flags import Flag, port_flag
from ..helpers import host_names, hosts_size, plugin_error, plugin_warning, reject, require_port_free, task_hint
from ..pod import ensure_env, ensure_port
from .svc import MOUNT_PATH, host_file_key

PORT_NAME = "mpijob-port"


class MPIPlugin(Plugin):
    name = "mpi"
    requires = ("svc", "ssh")
    flags = (
        Flag("master", "string", "master", "name of the launcher task"),
        Flag("worker", "string", "worker", "name of the worker task"),
        port_flag("port", 22, "port opened on every container"),
    )

    def check(self) -> list[str]:
        # Volcano's job admission rejects this too (admit_job.go: "The specified mpi master task was not found").
        if self.job.task(self.options["master"]) is None:
            raise plugin_error(self, "--master", f"the job has no task {self.options['master']!r} (the specified mpi master task was not found)"
                               f"{task_hint(self, self.options['master'])}")
        worker = self.job.task(self.options["worker"])
        # Without a worker task the master's Pods are left alone; every other Pod gets the port.
        ported = [t for t in self.job.tasks if worker is not None or t.name != self.options["master"]]
        require_port_free(self, ported, PORT_NAME, self.options["port"], init=True)
        if worker is None:
            return [plugin_warning(self, f"--worker: the job has no task {self.options['worker']!r}; the master gets no MPI_HOST and no port")]
        size = hosts_size(self, worker).joined()
        if size > env_value_limit("MPI_HOST"):
            return [plugin_warning(
                self,
                f"MPI_HOST left out of the master's containers: the hosts of task {worker.name!r} are {size} bytes, over "
                f"{ENV_LIMIT_TEXT}; give mpirun --hostfile {MOUNT_PATH}/{host_file_key(worker.name)} instead"
            )]
        return []

    @cached_property
    def mpi_host(self) -> str | None:
        """The worker Pods' domain names, comma-joined; None when there is no worker task or the
        list is too long for the environment (check() warned)."""
        worker = self.job.task(self.options["worker"])
        if worker is None or hosts_size(self, worker).joined() > env_value_limit("MPI_HOST"):
            return None
        return ",".join(host_names(self, worker))

    def mutate(self, ctx: PodContext) -> None:
        hosts: str | None = None
        if ctx.task.name == self.options["master"]:
            if self.job.task(self.options["worker"]) is None:  # Volcano leaves the Pod alone; check() warned
                return
            hosts = self.mpi_host
            if hosts is not None:
                ctx.names_hosts(self.name)
        for where, container in ctx.located_containers(init_first=True):
            reject(self, f"{where}.ports", ensure_port(container, PORT_NAME, self.options["port"]))
            if hosts is not None:
                ensure_env(container, "MPI_HOST", hosts)
