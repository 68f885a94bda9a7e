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

from .base import Plugin, PodContext
from .flags import Flag, port_flag
from .job import Task
from .pod import Obj, containers, ensure_envs, ensure_port

PORT_NAME = "jax-port"


class JaxPlugin(Plugin):
    name = "jax"
    requires = ("svc",)
    flags = (
        port_flag("port", 6666, "coordinator port"),
        Flag("coordinator", "string", "", "task whose Pod 0 is the coordinator (process 0); default the first task"),
    )

    @cached_property
    def coordinator(self) -> Task | None:
        name = self.options["coordinator"]
        return self.job.tasks[0] if not name else self.job.task(name)

    def check(self) -> list[str]:
        coordinator = self.coordinator
        if coordinator is None:
            tasks = ", ".join(t.name for t in self.job.tasks)
            raise self.error("--coordinator", f"the job has no task {self.options['coordinator']!r} (tasks: {tasks})")
        if coordinator.replicas < 1:
            raise self.error("--coordinator", f"task {coordinator.name!r} has no replicas, so there is no coordinator Pod 0")
        self.require_port_free([coordinator], PORT_NAME, self.options["port"])
        return []

    @cached_property
    def offsets(self) -> dict[str, int]:
        """The first process id of each task: the coordinator task first, then ``spec.tasks`` order."""
        coordinator = self.coordinator
        ordered = [coordinator] + [t for t in self.job.tasks if t is not coordinator]
        out, total = {}, 0
        for task in ordered:
            if task is None:
                continue
            out[task.name] = total
            total += task.replicas
        return out

    @property
    def num_processes(self) -> int:
        return sum(task.replicas for task in self.job.tasks)

    def mutate(self, ctx: PodContext) -> None:
        coordinator = self.coordinator
        if coordinator is None:  # check() raised already; keep mypy and direct callers honest
            raise self.error("--coordinator", f"the job has no task {self.options['coordinator']!r}")
        index = ctx.index_number(self.name)
        if index >= ctx.task.replicas:
            ctx.warnings.append(
                self.warning(f"Pod {ctx.pod_name!r} has index {index}, beyond the {ctx.task.replicas} replicas of task {ctx.task.name!r}")
            )
        port = self.options["port"]
        entries: list[tuple[str, str | None, Obj | None]] = [
            ("JAX_COORDINATOR_ADDRESS", f"{self.job.domain_name(coordinator, 0)}:{port}", None),
            ("JAX_NUM_PROCESSES", str(self.num_processes), None),
            ("JAX_PROCESS_ID", str(self.offsets[ctx.task.name] + index), None),
        ]
        for i, container in enumerate(containers(ctx.pod)):
            if ctx.task.name == coordinator.name:
                problem = ensure_port(container, PORT_NAME, port)
                if problem:
                    raise self.error(f"spec.containers[{i}].ports", problem)
            ensure_envs(container, entries)
