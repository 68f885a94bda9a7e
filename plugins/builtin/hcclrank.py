"""``hcclrank``: the Ascend HCCL rank as the Pod annotation ``hccl/rankIndex``, from the ``RANK`` the
container runs with (docs/volcano-behaviour.md#hcclrank-where-we-differ)."""

from __future__ import annotations

from ..base import Plugin, PodContext
from ..flags import Flag
from ..pod import containers

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
        rank = self._effective_rank(ctx)
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
    def _effective_rank(ctx: PodContext) -> str:
        """The ``RANK`` value the first container that sets ``RANK`` runs with: its last entry of
        that name ("" for ``valueFrom``, whose value only the kubelet knows, as in Volcano)."""
        for container in containers(ctx.pod):
            ranks = [e for e in container.get("env") or [] if isinstance(e, dict) and e.get("name") == "RANK"]
            if ranks:
                return str(ranks[-1].get("value") or "")
        return ""
