"""``tensorflow``: ``TF_CONFIG`` for every regular container (SPEC Part 2 §6.5).

The cluster lists ``<domain>:<port>`` of every Pod of the ps, worker, chief and evaluator tasks; the
task is the Pod's role and index. A job of exactly one task with one replica gets nothing.
"""

from __future__ import annotations

import json
from functools import cached_property

from .base import Plugin, PodContext
from .flags import Flag, port_flag
from .pod import containers, ensure_env

# Go's json.Marshal writes tfClusterSpec's fields in this order and leaves out empty ones.
ROLES = ("ps", "worker", "chief", "evaluator")


class TensorflowPlugin(Plugin):
    name = "tensorflow"
    requires = ("svc",)
    flags = (
        Flag("ps", "string", "ps", "name of the parameter-server task"),
        Flag("worker", "string", "worker", "name of the worker task"),
        Flag("chief", "string", "chief", "name of the chief task"),
        Flag("evaluator", "string", "evaluator", "name of the evaluator task"),
        port_flag("port", 2222, "port in every TF_CONFIG cluster address"),
    )

    def _single(self) -> bool:
        return len(self.job.tasks) == 1 and self.job.tasks[0].replicas == 1

    def check(self) -> list[str]:
        if self._single():
            return [self.warning("the job has one task with one replica, which gets no TF_CONFIG (as in Volcano)")]
        return []

    @cached_property
    def _cluster_json(self) -> str:
        return json.dumps(self.cluster(), separators=(",", ":"), ensure_ascii=False)

    def cluster(self) -> dict[str, list[str]]:
        port = self.options["port"]
        # Volcano's switch on the task name: the first role whose flag names the task wins.
        role_of: dict[str, str] = {}
        for role in ROLES:
            role_of.setdefault(self.options[role], role)
        found: dict[str, list[str]] = {}
        for task in self.job.tasks:
            role = role_of.get(task.name)
            if role is not None:
                found[role] = [f"{self.job.domain_name(task, i)}:{port}" for i in range(task.replicas)]
        return {role: found[role] for role in ROLES if found.get(role)}

    def task_type(self, task_name: str) -> str:
        """The Pod's role, checked in Volcano's order chief, worker, ps, evaluator; else the task name."""
        for role in ("chief", "worker", "ps", "evaluator"):
            if task_name == self.options[role]:
                return role
        return task_name

    def mutate(self, ctx: PodContext) -> None:
        if self._single():
            return
        index = ctx.index_number(self.name)
        task = json.dumps({"type": self.task_type(ctx.task.name), "index": index}, separators=(",", ":"), ensure_ascii=False)
        # Go's json.Marshal of {cluster, task}, with the job-wide cluster part serialised once.
        value = f'{{"cluster":{self._cluster_json},"task":{task}}}'
        for container in containers(ctx.pod):
            ensure_env(container, "TF_CONFIG", value)
