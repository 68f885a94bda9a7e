"""One group of every Pod of a job, for ``xgboost``, ``paddle`` and ``jax``: rank 0 is a named task's
Pod 0, the rest follow in ``spec.tasks`` order."""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar

from ..base import Plugin, PodContext
from ..helpers import plugin_error, plugin_warning, reject, require_task
from ..job import Task
from ..pod import Obj, containers, ensure_envs, ensure_port


class GroupPlugin(Plugin):
    """A plugin of one group of every Pod of the job, rank 0 on Pod 0 of the task its flag
    ``leader_flag`` names (default: the first task)."""

    requires = ("svc",)
    leader_flag: ClassVar[str] = ""
    # How the error ends when that task has no Pod 0.
    no_pod_0: ClassVar[str] = "there is no Pod 0 to be rank 0"

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


def size(tasks: tuple[Task, ...]) -> int:
    """Every replica of every task."""
    return sum(task.replicas for task in tasks)


def member_index(plugin: Plugin, ctx: PodContext) -> int:
    """The Pod's index in its task; a warning when it is past the task's replicas, where its rank is
    also the rank of the next task's first Pod."""
    index = ctx.index_number(plugin.name)
    if index >= ctx.task.replicas:
        ctx.warnings.append(
            plugin_warning(plugin, f"Pod {ctx.pod_name!r} has index {index}, beyond the {ctx.task.replicas} replicas of task {ctx.task.name!r}")
        )
    return index


def wire_members(plugin: Plugin, ctx: PodContext, entries: list[tuple[str, str | None, Obj | None]],
                 port: tuple[str, int] | None) -> None:
    """Set ``entries`` in every regular container of the Pod; with ``port`` (name, number), on the
    Pods of the rank-0 task, also declare that port, refusing a container whose port name is taken."""
    for i, container in enumerate(containers(ctx.pod)):
        if port is not None:
            reject(plugin, f"spec.containers[{i}].ports", ensure_port(container, *port))
        ensure_envs(container, entries)
