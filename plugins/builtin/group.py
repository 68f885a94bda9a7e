"""One group of every Pod of a job, for ``xgboost``, ``paddle`` and ``jax``: rank 0 is a named task's
Pod 0, the rest follow in ``spec.tasks`` order; and the refusal of a template that sets a variable
the plugin sets."""

from __future__ import annotations

from ..base import Plugin, PodContext
from ..helpers import plugin_error, plugin_warning, task_hint
from ..job import Task
from ..pod import Obj, containers, ensure_envs, ensure_port


def first_task(plugin: Plugin, flag: str, no_pod_0: str = "there is no Pod 0 to be rank 0") -> Task:
    """The task named by ``flag`` (default: the first task), which must have a Pod 0; ``no_pod_0``
    ends the error when it has none."""
    name = plugin.options[flag]
    task = plugin.job.tasks[0] if not name else plugin.job.task(name)
    if task is None:
        tasks = ", ".join(t.name for t in plugin.job.tasks)
        raise plugin_error(plugin, f"--{flag}", f"the job has no task {name!r}{task_hint(plugin, name)} (tasks: {tasks})")
    if task.replicas < 1:
        raise plugin_error(plugin, f"--{flag}", f"task {task.name!r} has no replicas, so {no_pod_0}")
    return task


def offsets(tasks: tuple[Task, ...], first: Task) -> dict[str, int]:
    """The rank of each task's Pod 0: ``first`` counts first, then the others in ``spec.tasks`` order."""
    out, total = {}, 0
    for task in [first, *(t for t in tasks if t is not first)]:
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
            problem = ensure_port(container, *port)
            if problem:
                raise plugin_error(plugin, f"spec.containers[{i}].ports", problem)
        ensure_envs(container, entries)
