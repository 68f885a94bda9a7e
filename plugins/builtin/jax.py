"""``jax``: the coordinator address, process count and process id for ``jax.distributed.initialize``
(docs/volcano-behaviour.md#jax)."""

from __future__ import annotations

from ..base import PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name, require_port_free
from ..pod import Obj
from .group import GroupPlugin, member_index, size, wire_members

PORT_NAME = "jax-port"


class JaxPlugin(GroupPlugin):
    name = "jax"
    leader_flag = "coordinator"
    no_pod_0 = "there is no coordinator Pod 0"
    flags = (
        port_flag("port", 6666, "coordinator port"),
        Flag("coordinator", "string", "", "task whose Pod 0 is the coordinator (process 0); default the first task"),
    )

    def check(self) -> list[str]:
        require_port_free(self, [self.leader], PORT_NAME, self.options["port"])
        return []

    def mutate(self, ctx: PodContext) -> None:
        coordinator = self.leader
        index = member_index(self, ctx)
        port = self.options["port"]
        entries: list[tuple[str, str | None, Obj | None]] = [
            ("JAX_COORDINATOR_ADDRESS", f"{domain_name(self, coordinator, 0)}:{port}", None),
            ("JAX_NUM_PROCESSES", str(size(self.job.tasks)), None),
            ("JAX_PROCESS_ID", str(self.offsets[ctx.task.name] + index), None),
        ]
        ctx.names_hosts(self.name)
        wire_members(self, ctx, entries, (PORT_NAME, port) if ctx.task.name == coordinator.name else None)
