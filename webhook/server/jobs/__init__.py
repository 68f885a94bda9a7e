"""Where the webhook finds Volcano Jobs: one small interface, two sources.

* :class:`~.files.DirectoryJobSource` (the embedded default): Job YAML/JSON files in a directory;
* :class:`~.kube.KubeJobSource`: a watch-backed cache of the cluster's Jobs in the watched
  namespaces (imported from :mod:`.kube`, which needs the ``kubernetes`` client).

Admission never waits on a list: ``get`` answers from memory, and a kube cache miss costs one GET.
"""

from __future__ import annotations

from typing import Any, Protocol

from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, Kind

from .files import DirectoryJobSource

__all__ = ["DirectoryJobSource", "JobSource", "NamespaceNotWatched"]


class NamespaceNotWatched(LookupError):
    """A lookup in a namespace the source does not serve (``--namespace``): the Pod is not wired."""

    def __init__(self, namespace: str) -> None:
        super().__init__(namespace)
        self.namespace = namespace



class JobSource(Protocol):
    """What the webhook needs from a store of Volcano Jobs."""

    def start(self) -> None:
        """Begin loading; returns at once (``ready`` turns true when the first load is done)."""

    def stop(self) -> None:
        """Stop background work."""

    @property
    def ready(self) -> bool:
        """True once the source holds a complete view (``/readyz``)."""

    def __len__(self) -> int:
        """Jobs held in memory."""

    def status(self) -> dict[str, Any]:
        """Details for ``/readyz``."""

    async def get(self, namespace: str, name: str, uid: str | None = None, kind: Kind = VOLCANO_JOB) -> dict[str, Any] | None:
        """The Job object, or None when there is no such Job; raises :class:`NamespaceNotWatched`
        for a namespace the source does not serve. ``uid`` is the one the caller expects (a Pod's
        owner): a held Job of another uid is a predecessor of the same name, so a source that can
        asks again rather than answer with it. ``kind`` (a workload row of the table of kinds) asks
        for an Indexed Job or a JobSet instead."""

