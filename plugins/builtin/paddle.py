"""``paddle``: the environment ``python -m paddle.distributed.launch`` reads to make one collective job of
every Pod of the job (docs/volcano-behaviour.md#paddle)."""

from __future__ import annotations

from ..base import PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name, reject_reserved_env, require_port_free
from ..pod import Obj
from .group import GroupPlugin, member_index, size, wire_members

PORT_NAME = "paddle-port"
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
    flags = (
        port_flag("port", DEFAULT_PORT, "the master's rendezvous port (PADDLE_MASTER)"),
        Flag("master", "string", "", "task whose Pod 0 is node rank 0 and runs the rendezvous server; default the first task"),
    )

    def check(self) -> list[str]:
        _ = self.leader
        reject_reserved_env(
            self, RESERVED.__contains__, "paddle.distributed.launch would take the job's master, node count, rank or id from it instead of the plugin's"
        )
        require_port_free(self, [self.leader], PORT_NAME, self.options["port"])
        return []

    def mutate(self, ctx: PodContext) -> None:
        master = self.leader
        index = member_index(self, ctx)
        port = self.options["port"]
        on_master = ctx.task.name == master.name
        host = LOOPBACK if on_master and index == 0 else domain_name(self, master, 0)
        if host != LOOPBACK:
            ctx.names_hosts(self.name)
        entries: list[tuple[str, str | None, Obj | None]] = [
            ("PADDLE_MASTER", f"{host}:{port}", None),
            ("PADDLE_NNODES", str(size(self.job.tasks)), None),
            ("PADDLE_JOB_ID", self.job.name, None),
            ("PADDLE_RANK", str(self.offsets[ctx.task.name] + index), None),
        ]
        wire_members(self, ctx, entries, (PORT_NAME, port) if on_master else None)
