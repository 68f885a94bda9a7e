"""``paddle``: the environment ``python -m paddle.distributed.launch`` reads to make one collective job of
every Pod of the job (docs/volcano-behaviour.md#paddle)."""

from __future__ import annotations

from ..base import PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name
from .group import EnvEntries, GroupPlugin

DEFAULT_PORT = 6768
# On the master's Pod 0: the launcher starts its rendezvous server only for a loopback or own-IP
# master address, never a DNS name.
LOOPBACK = "127.0.0.1"
RESERVED = frozenset({
    "PADDLE_MASTER", "PADDLE_NNODES", "PADDLE_JOB_ID", "PADDLE_RANK",
    "PADDLE_TRAINER_ID", "PADDLE_TRAINER_ENDPOINTS", "DISTRIBUTED_TRAINER_ENDPOINTS",
})


class PaddlePlugin(GroupPlugin):
    name = "paddle"
    leader_flag = "master"
    port_name = "paddle-port"
    reserved = RESERVED
    reserved_why = "paddle.distributed.launch would take the job's master, node count, rank or id from it instead of the plugin's"
    flags = (
        port_flag("port", DEFAULT_PORT, "the master's rendezvous port (PADDLE_MASTER)"),
        Flag("master", "string", "", "task whose Pod 0 is node rank 0 and runs the rendezvous server; default the first task"),
    )

    def group_env(self, ctx: PodContext, rank: int, index: int) -> EnvEntries:
        host = LOOPBACK if ctx.task.name == self.leader.name and index == 0 else domain_name(self, self.leader, 0)
        if host != LOOPBACK:
            ctx.names_hosts(self.name)
        return [
            ("PADDLE_MASTER", f"{host}:{self.options['port']}", None),
            ("PADDLE_NNODES", str(self.size), None),
            ("PADDLE_JOB_ID", self.job.name, None),
            ("PADDLE_RANK", str(rank), None),
        ]
