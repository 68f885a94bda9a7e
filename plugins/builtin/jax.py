"""``jax``: the coordinator address, process count and process id for ``jax.distributed.initialize``.

Not a Volcano plugin: a built-in of this project, enabled like the others through ``spec.plugins`` or
the ``volcano-job-webhook/plugins`` annotation. It brings in ``svc`` (stable Pod host names).

Every regular container of every Pod of the job gets:

* ``JAX_COORDINATOR_ADDRESS``: ``<coordinator task's Pod 0 domain>:<--port>`` (JAX reads this one
  itself);
* ``JAX_NUM_PROCESSES``: the replicas of all tasks together;
* ``JAX_PROCESS_ID``: the replicas of the tasks before the Pod's task + the Pod's index, counting
  the ``--coordinator`` task first and then the others in ``spec.tasks`` order. JAX runs its
  coordination service in process 0, so process 0 must be the coordinator task's Pod 0; with the
  default coordinator (the first task) this is plain ``spec.tasks`` order.

The containers of the coordinator task's Pods also get the port ``jax-port`` (``--port``, default
6666), unless they already have a port of that number. Pass the last two to JAX yourself:
``jax.distributed.initialize(num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
process_id=int(os.environ["JAX_PROCESS_ID"]))``.
"""

from __future__ import annotations

from functools import cached_property

from ..base import Plugin, PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name, require_port_free
from ..job import Task
from ..pod import Obj
from .group import first_task, member_index, offsets, size, wire_members

PORT_NAME = "jax-port"


class JaxPlugin(Plugin):
    name = "jax"
    requires = ("svc",)
    flags = (
        port_flag("port", 6666, "coordinator port"),
        Flag("coordinator", "string", "", "task whose Pod 0 is the coordinator (process 0); default the first task"),
    )

    @cached_property
    def coordinator(self) -> Task:
        return first_task(self, "coordinator", no_pod_0="there is no coordinator Pod 0")

    @cached_property
    def offsets(self) -> dict[str, int]:
        """The first process id of each task: the coordinator task first, then ``spec.tasks`` order."""
        return offsets(self.job.tasks, self.coordinator)

    def check(self) -> list[str]:
        require_port_free(self, [self.coordinator], PORT_NAME, self.options["port"])
        return []

    def mutate(self, ctx: PodContext) -> None:
        coordinator = self.coordinator
        index = member_index(self, ctx)
        port = self.options["port"]
        entries: list[tuple[str, str | None, Obj | None]] = [
            ("JAX_COORDINATOR_ADDRESS", f"{domain_name(self, coordinator, 0)}:{port}", None),
            ("JAX_NUM_PROCESSES", str(size(self.job.tasks)), None),
            ("JAX_PROCESS_ID", str(self.offsets[ctx.task.name] + index), None),
        ]
        ctx.names_hosts(self.name)
        wire_members(self, ctx, entries, (PORT_NAME, port) if ctx.task.name == coordinator.name else None)
