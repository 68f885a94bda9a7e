"""``tensorflow``: ``TF_CONFIG`` for every regular container (docs/volcano-behaviour.md#tensorflow); one
over an environment string refuses the job, as TensorFlow reads the cluster from it only."""

from __future__ import annotations

import json
from functools import cached_property

from ..base import Plugin, PodContext
from ..budget import ENV_LIMIT_TEXT, digits, env_value_limit
from ..flags import Flag, port_flag
from ..helpers import domain_name, hosts_size, plugin_error, plugin_warning
from ..job import Task
from ..pod import containers, ensure_env

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
            return [plugin_warning(self, "the job has one task with one replica, which gets no TF_CONFIG (as in Volcano)")]
        self._require_fits(*self.largest_tf_config())
        return []

    def _require_fits(self, size: int, task: Task | None) -> None:
        if size > env_value_limit("TF_CONFIG"):
            raise plugin_error(
                self,
                task.replicas_path if task else self.job.tasks_field,
                f"TF_CONFIG would be {size} bytes (a cluster of {sum(t.replicas for t in self._role_tasks().values())} addresses), over {ENV_LIMIT_TEXT}; "
                "TensorFlow reads the cluster from this variable only",
            )

    def _role_tasks(self) -> dict[str, Task]:
        """Each role's task, as Volcano's switch on the task name assigns it (first role wins)."""
        role_of: dict[str, str] = {}
        for role in ROLES:
            role_of.setdefault(self.options[role], role)
        return {role_of[task.name]: task for task in self.job.tasks if task.name in role_of}

    def cluster_size(self) -> int:
        """``len(self._cluster_json)`` from counts alone: ``{"<role>":["<host>:<port>",...],...}``."""
        each = len('"":') + digits(self.options["port"])
        parts = [
            len(f'"{role}":[]') + hosts_size(self, task, every_replica=True).joined(sep=1, each=each)
            for role, task in self._role_tasks().items()
            if task.replicas
        ]
        return 2 + sum(parts) + max(len(parts) - 1, 0)

    def largest_tf_config(self) -> tuple[int, Task | None]:
        """The longest TF_CONFIG of any Pod of the job, and the task of the largest role list (the
        one to shrink)."""
        cluster = self.cluster_size()
        task_part = max(
            (len('{"type":"","index":}') + len(self.task_type(t.name)) + digits(t.replicas - 1) for t in self.job.tasks if t.replicas),
            default=0,
        )
        largest = max(self._role_tasks().values(), key=lambda t: t.replicas, default=None)
        return len('{"cluster":,"task":}') + cluster + task_part, largest

    @cached_property
    def _cluster_json(self) -> str:
        # Sized before it is built, whoever calls first (the chain runs check() before any Pod).
        self._require_fits(*self.largest_tf_config())
        return json.dumps(self.cluster(), separators=(",", ":"), ensure_ascii=False)

    def cluster(self) -> dict[str, list[str]]:
        """The cluster part, as long as the replicas: check() has sized it first."""
        port = self.options["port"]
        found = {
            role: [f"{domain_name(self, task, i)}:{port}" for i in range(task.replicas)]
            for role, task in self._role_tasks().items()
        }
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
        # A hand-made Pod's index may have more digits than the job's replicas allow for.
        self._require_fits(len(value), ctx.task)
        ctx.names_hosts(self.name)
        for container in containers(ctx.pod):
            ensure_env(container, "TF_CONFIG", value)
