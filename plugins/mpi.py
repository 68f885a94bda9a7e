"""``mpi``: the launcher's host list and the MPI port (SPEC Part 2 §6.6).

Master Pods get ``MPI_HOST``, the comma-joined domain names of the worker Pods, in every init
container and container; every Pod of the job gets the port ``mpijob-port`` (default 22). Keys and
host resolution come from ``ssh`` and ``svc``, which this plugin brings in.
"""

from __future__ import annotations

from functools import cached_property

from .base import Plugin, PodContext
from .flags import Flag, port_flag
from .pod import ensure_env, ensure_port

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
            raise self.error("--master", f"the job has no task {self.options['master']!r} (the specified mpi master task was not found)")
        if self.job.task(self.options["worker"]) is None:
            return [self.warning(f"--worker: the job has no task {self.options['worker']!r}; the master gets no MPI_HOST and no port")]
        return []

    @cached_property
    def mpi_host(self) -> str | None:
        """The worker Pods' domain names, comma-joined; None when there is no worker task."""
        worker = self.job.task(self.options["worker"])
        return ",".join(self.job.host_names(worker)) if worker else None

    def mutate(self, ctx: PodContext) -> None:
        hosts: str | None = None
        if ctx.task.name == self.options["master"]:
            hosts = self.mpi_host
            if hosts is None:  # no worker task: Volcano leaves the Pod alone; check() warned
                return
        for container in ctx.all_containers(init_first=True):
            ensure_port(container, PORT_NAME, self.options["port"])
            if hosts is not None:
                ensure_env(container, "MPI_HOST", hosts)
