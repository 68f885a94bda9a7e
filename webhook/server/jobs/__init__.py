"""Where the webhook finds Jobs: :class:`JobSource`, kept by job files
(:class:`~.directory.DirectoryJobSource`) and by the cluster's cache (:class:`~.kube.KubeJobSource`,
imported from :mod:`.kube` only, as it needs the ``kubernetes`` client)."""

from __future__ import annotations

from typing import Any, Protocol

from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, Kind

from .directory import DirectoryJobSource, WorkloadKey

__all__ = ["DirectoryJobSource", "JobSource", "NamespaceNotWatched", "WorkloadKey"]


class NamespaceNotWatched(LookupError):
    """A lookup in a namespace the source does not serve (``--namespace``): the Pod is not wired."""


class JobSource(Protocol):
    """What the webhook needs from a store of Jobs: ``start`` returns at once and ``ready`` turns
    true once the first load is done; ``status`` is for ``/readyz``."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    @property
    def ready(self) -> bool:
        """True once the source holds a complete view (``/readyz``)."""

    def __len__(self) -> int: ...

    def status(self) -> dict[str, Any]: ...

    async def get(self, namespace: str, name: str, uid: str | None = None, kind: Kind = VOLCANO_JOB) -> dict[str, Any] | None:
        """The workload of ``kind`` (a Volcano Job unless said), or None; :class:`NamespaceNotWatched`
        for a namespace the source does not serve. A held Job of another ``uid`` than the one
        expected (a Pod's owner) is a predecessor of the same name: a source that can asks again."""

