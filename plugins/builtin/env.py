"""``env``: every container learns its index within its task (docs/volcano-behaviour.md#env)."""

from __future__ import annotations

from ..base import Plugin, PodContext
from ..pod import ensure_envs

INDEX_ENV_NAMES = ("VK_TASK_INDEX", "VC_TASK_INDEX")


class EnvPlugin(Plugin):
    name = "env"

    def mutate(self, ctx: PodContext) -> None:
        index = ctx.index(self.name)
        entries = [(env_name, index, None) for env_name in INDEX_ENV_NAMES]
        for container in ctx.all_containers():
            ensure_envs(container, entries)
