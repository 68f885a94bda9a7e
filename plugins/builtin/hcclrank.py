"""``hcclrank``: the Ascend HCCL rank as the Pod annotation ``hccl/rankIndex`` (docs/volcano-behaviour.md#hcclrank).

An existing annotation is kept; else the ``RANK`` of the first container that sets one (pytorch's,
which runs before this plugin) is copied; else master Pods get their index and workers ``master
replicas + index``. Pods of other tasks are left alone.

Where that container lists ``RANK`` more than once, the kubelet runs it with the last entry
(``makeEnvironmentVariables`` keeps the last of a name), and that is the one copied here. Volcano
copies the first: with pytorch on a template that sets ``RANK`` itself, Volcano appends pytorch's
after the template's and copies the template's, so every replica of the task gets the same
``hccl/rankIndex`` while its processes run with pytorch's ranks. Here pytorch replaces the
template's entry in place, and the annotation is the rank the container runs with
(docs/volcano-behaviour.md#hcclrank-where-we-differ).
"""

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
