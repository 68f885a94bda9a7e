"""One group of every Pod of a job, for ``xgboost``, ``paddle`` and ``jax``: rank 0 is a named task's
Pod 0, the rest follow in ``spec.tasks`` order."""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

from ..base import Plugin, PodContext
from ..helpers import plugin_error, plugin_warning, reject, reject_reserved_env, require_port_free, require_task
from ..job import Task
from ..pod import Obj, containers, ensure_envs, ensure_port

EnvEntries = list[tuple[str, str | None, Obj | None]]


class GroupPlugin(Plugin):
    """A plugin of one group of every Pod of the job, rank 0 on Pod 0 of the task its flag
    ``leader_flag`` names (default: the first task), which declares the port ``port_name``."""

    requires = ("svc",)
    leader_flag: ClassVar[str] = ""
    port_name: ClassVar[str] = ""
    # How the error ends when that task has no Pod 0.
    no_pod_0: ClassVar[str] = "there is no Pod 0 to be rank 0"
    # The variables a template may not set, and why (none: it may set any).
    reserved: ClassVar[frozenset[str]] = frozenset()
    reserved_why: ClassVar[str] = ""

    @cached_property
    def leader(self) -> Task:
        name = self.options[self.leader_flag]
        task = self.job.tasks[0] if not name else require_task(self, f"--{self.leader_flag}", name)
        if task.replicas < 1:
            raise plugin_error(self, f"--{self.leader_flag}", f"task {task.name!r} has no replicas, so {self.no_pod_0}")
        return task

    @cached_property
    def offsets(self) -> dict[str, int]:
        """The rank of each task's Pod 0: the leader's task first, then the others in ``spec.tasks`` order."""
        out, total = {}, 0
        for task in [self.leader, *(t for t in self.job.tasks if t is not self.leader)]:
            out[task.name] = total
            total += task.replicas
        return out

    @property
    def size(self) -> int:
        """Every replica of every task."""
        return sum(task.replicas for task in self.job.tasks)

    def check(self) -> list[str]:
        leader = self.leader
        if self.reserved:
            reject_reserved_env(self, self.reserved.__contains__, self.reserved_why)
        require_port_free(self, [leader], self.port_name, self.options["port"])
        return []

    def group_env(self, ctx: PodContext, rank: int, index: int) -> EnvEntries:
        """The variables of the Pod of ``rank`` (``index`` in its task); says whether it names hosts."""
        raise NotImplementedError

    def mutate(self, ctx: PodContext) -> None:
        """Set :meth:`group_env` in every regular container of the Pod; on the Pods of the rank-0 task,
        also declare the port, refusing a container whose port name is taken."""
        index = ctx.index_number(self.name)
        if index >= ctx.task.replicas:  # its rank is also the rank of the next task's first Pod
            ctx.warnings.append(
                plugin_warning(self, f"Pod {ctx.pod_name!r} has index {index}, beyond the {ctx.task.replicas} replicas of task {ctx.task.name!r}")
            )
        entries = self.group_env(ctx, self.offsets[ctx.task.name] + index, index)
        on_leader = ctx.task.name == self.leader.name
        for i, container in enumerate(containers(ctx.pod)):
            if on_leader:
                reject(self, f"spec.containers[{i}].ports", ensure_port(container, self.port_name, self.options["port"]))
            ensure_envs(container, entries)
