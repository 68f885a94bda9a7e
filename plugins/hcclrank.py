"""``hcclrank``: the Ascend HCCL rank as the Pod annotation ``hccl/rankIndex`` (SPEC Part 2 §6.8).

An existing annotation is kept; else the first container ``RANK`` value (pytorch's, which runs
before this plugin) is copied; else master Pods get their index and workers ``master replicas +
index``. Pods of other tasks are left alone.
"""

from __future__ import annotations

from .base import Plugin, PodContext
from .flags import Flag
from .pod import containers

RANK_ANNOTATION = "hccl/rankIndex"


class HcclRankPlugin(Plugin):
    name = "hcclrank"
    flags = (
        Flag("master", "string", "master", "name of the master task"),
        Flag("worker", "string", "worker", "name of the worker task"),
    )

    def mutate(self, ctx: PodContext) -> None:
        meta = ctx.pod.setdefault("metadata", {})
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and annotations.get(RANK_ANNOTATION):
            return
        rank = self._first_rank(ctx)
        if not rank:
            if ctx.task.name == self.options["master"]:
                rank = str(ctx.index_number(self.name))
            elif ctx.task.name == self.options["worker"]:
                rank = str(self.job.replicas(self.options["master"]) + ctx.index_number(self.name))
            else:
                return
        if not isinstance(annotations, dict):
            meta["annotations"] = annotations = {}
        annotations[RANK_ANNOTATION] = rank

    @staticmethod
    def _first_rank(ctx: PodContext) -> str:
        """Volcano's ``getEnv``: the value of the first ``RANK`` in container order ("" for valueFrom)."""
        for container in containers(ctx.pod):
            for entry in container.get("env") or []:
                if isinstance(entry, dict) and entry.get("name") == "RANK":
                    return str(entry.get("value") or "")
        return ""
