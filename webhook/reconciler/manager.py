"""``volcano-webhook reconcile``'s controller, assembled: controller-runtime's builder
``For(Job).Owns(ConfigMap, Secret, Service, NetworkPolicy)`` with :class:`~.jobs.JobReconciler` as
the ``Reconcile``.

The caches: Volcano Jobs as records (:class:`~volcano_job_webhook.kube.records.JobRecord`), and of
each owned kind only the objects with our label (the ``managed-by`` selector), as records indexed by
owning Job. An event on a Job queues it, an event on an owned object queues its owner.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from kubernetes import client

from volcano_job_webhook.kube.informer import Informer, JobInformer
from volcano_job_webhook.kube.rest import Rest, widen_pool
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.plugins.keys import JobKey

from .controller import Controller
from .events import EventRecorder
from .jobs import JobReconciler
from .kinds import MANAGED_SELECTOR, OWNED, OwnedRecord
from .metrics import ReconcilerMetrics
from .workqueue import WorkQueue
from .writer import ObjectWriter


class Reconciler:
    """The job controller: caches, work queue, workers, the job reconciler. ``is_leader`` gates
    every write."""

    def __init__(
        self,
        api: client.ApiClient,
        chain: Chain | None = None,
        *,
        namespaces: Iterable[str] = (),
        resync_seconds: float = 300.0,
        workers: int = 4,
        is_leader: Callable[[], bool] = lambda: True,
        metrics: ReconcilerMetrics | None = None,
        on_synced: Callable[[], None] | None = None,
    ) -> None:
        self.metrics = metrics = metrics or ReconcilerMetrics()
        self.namespaces = list(namespaces)
        watches = len(self.namespaces or [""]) * (1 + len(OWNED))
        widen_pool(api, watches + workers * 4 + 4)
        rest = Rest(api)
        self._stopping = threading.Event()

        def may_write() -> bool:
            # Stopping: a reconcile with many writes left ends at its next one (the next leader redoes it).
            return not self._stopping.is_set() and is_leader()

        self.jobs = JobInformer(api, self.namespaces)
        self.owned: dict[str, Informer[OwnedRecord]] = {
            kind: Informer(api, resource, self.namespaces, transform=OwnedRecord, label_selector=MANAGED_SELECTOR,
                           index=_owner, deleted_objects=kind == "Secret")
            for kind, resource in OWNED.items()
        }
        self.events = EventRecorder(rest, metrics, is_leader)
        self.writer = ObjectWriter(rest, self.owned, metrics, self.events, may_write, threads=workers * 4)
        self.job_reconciler = JobReconciler(self.jobs, self.owned, chain or Chain(), self.writer, self.events, metrics, may_write)
        self.controller = Controller(self.jobs, self.owned, self.job_reconciler.reconcile, resync_seconds=resync_seconds,
                                     workers=workers, is_leader=is_leader, metrics=metrics, on_synced=on_synced)
        self.jobs.on_event = self.controller.on_primary
        for kind, informer in self.owned.items():
            informer.on_event = self.controller.owned_handler(kind, self.job_reconciler.on_owned)
        metrics.cached_jobs.set_function(lambda: len(self.jobs))
        for kind, informer in self.owned.items():
            metrics.cached_objects.labels(kind).set_function(informer.__len__)

    @property
    def queue(self) -> WorkQueue:
        return self.controller.queue

    @property
    def ready(self) -> bool:
        return self.controller.ready

    def start(self) -> None:
        self.controller.start()

    def stop(self, timeout: float = 1.5) -> None:
        """Stop taking work and writing at once; give in-flight reconciles ``timeout`` to finish."""
        self._stopping.set()
        self.controller.stop(timeout)
        self.writer.close()

    def leadership_changed(self, leading: bool) -> None:
        self.controller.leadership_changed(leading)

    def resync(self) -> int:
        return self.controller.resync()

    def reconcile(self, key: JobKey) -> None:
        self.job_reconciler.reconcile(key)


def _owner(record: OwnedRecord) -> JobKey | None:
    return record.owner


