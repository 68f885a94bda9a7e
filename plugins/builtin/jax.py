"""``jax``: the coordinator address, process count and process id for ``jax.distributed.initialize``
(docs/volcano-behaviour.md#jax)."""

from __future__ import annotations

from ..base import PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name
from .group import EnvEntries, GroupPlugin


class JaxPlugin(GroupPlugin):
    name = "jax"
    leader_flag = "coordinator"
    port_name = "jax-port"
    no_pod_0 = "there is no coordinator Pod 0"
    flags = (
        port_flag("port", 6666, "coordinator port"),
        Flag("coordinator", "string", "", "task whose Pod 0 is the coordinator (process 0); default the first task"),
    )

    def group_env(self, ctx: PodContext, rank: int, index: int) -> EnvEntries:
        ctx.names_hosts(self.name)
        return [
            ("JAX_COORDINATOR_ADDRESS", f"{domain_name(self, self.leader, 0)}:{self.options['port']}", None),
            ("JAX_NUM_PROCESSES", str(self.size), None),
            ("JAX_PROCESS_ID", str(rank), None),
        ]
