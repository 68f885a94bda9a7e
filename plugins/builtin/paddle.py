"""``paddle``: the environment ``python -m paddle.distributed.launch`` reads to join one collective
job made of every Pod of the job, so the launcher needs no command-line arguments.

Not a Volcano plugin: a built-in of this project, enabled like the others through ``spec.plugins`` or
the ``volcano-job-webhook/plugins`` annotation. It brings in ``svc`` (stable Pod host names).

Every regular container of every Pod of the job gets (the launcher's ``env_args_mapping`` turns each
into the flag in brackets):

* ``PADDLE_MASTER`` (``--master``): ``<master task's Pod 0 domain>:<--port>``; on that Pod itself
  ``127.0.0.1:<--port>``, because the launcher starts its rendezvous server only when the master's
  address is loopback or the Pod's own IP, never a DNS name (Kubeflow's PaddleJob gives that Pod its
  IP from the downward API for the same reason); the launcher then advertises the Pod's IP;
* ``PADDLE_NNODES`` (``--nnodes``): the replicas of all tasks together;
* ``PADDLE_JOB_ID`` (``--job_id``): the job's name, as Kubeflow's PaddleJob sets it;
* ``PADDLE_RANK`` (``--rank``): the replicas of the tasks before the Pod's task + the Pod's index,
  counting the ``--master`` task first and then the others in ``spec.tasks`` order, so the Pod
  running the rendezvous server is node rank 0.

The containers of the master task's Pods also get the port ``paddle-port`` (``--port``, default 6768:
the master port the launcher assumes for endpoints given without one, and outside the 35100-64000
range it draws the nodes' other ports from, so they cannot collide), unless they already have a port of that number.

Those four names are reserved, and so are the three the launcher lets override them
(``PADDLE_TRAINER_ID`` the rank, ``PADDLE_TRAINER_ENDPOINTS`` and ``DISTRIBUTED_TRAINER_ENDPOINTS``
the master and node count): a pod template that sets one is an error (at ``/validate`` and at
admission).
"""

from __future__ import annotations

from functools import cached_property

from ..base import Plugin, PodContext
from ..flags import Flag, port_flag
from ..helpers import domain_name, require_port_free
from ..job import Task
from ..pod import Obj
from .group import first_task, member_index, offsets, reject_reserved_env, size, wire_members

PORT_NAME = "paddle-port"
DEFAULT_PORT = 6768
LOOPBACK = "127.0.0.1"
RESERVED = frozenset({
    "PADDLE_MASTER", "PADDLE_NNODES", "PADDLE_JOB_ID", "PADDLE_RANK",
    "PADDLE_TRAINER_ID", "PADDLE_TRAINER_ENDPOINTS", "DISTRIBUTED_TRAINER_ENDPOINTS",
})


class PaddlePlugin(Plugin):
    name = "paddle"
    requires = ("svc",)
    flags = (
        port_flag("port", DEFAULT_PORT, "the master's rendezvous port (PADDLE_MASTER)"),
        Flag("master", "string", "", "task whose Pod 0 is node rank 0 and runs the rendezvous server; default the first task"),
    )

    @cached_property
    def master(self) -> Task:
        return first_task(self, "master")

    @cached_property
    def offsets(self) -> dict[str, int]:
        return offsets(self.job.tasks, self.master)

    def check(self) -> list[str]:
        _ = self.master
        reject_reserved_env(
            self, RESERVED, "paddle.distributed.launch would take the job's master, node count, rank or id from it instead of the plugin's"
        )
        require_port_free(self, [self.master], PORT_NAME, self.options["port"])
        return []

    def mutate(self, ctx: PodContext) -> None:
        master = self.master
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
