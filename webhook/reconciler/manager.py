"""``volcano-webhook reconcile``'s controller, assembled: controller-runtime's builder
``For(Job).Owns(ConfigMap, Secret, Service, NetworkPolicy)`` with :class:`~.jobs.JobReconciler` as
the ``Reconcile``.

The caches: Volcano Jobs as records (:class:`~volcano_job_webhook.kube.records.JobRecord`), and of
each owned kind only the objects with our label (the ``managed-by`` selector), as records indexed by
owning Job. An event on a Job queues it, an event on an owned object queues its owner.

Each workload kind that may opt in (Indexed Jobs, JobSets: docs/workloads.md) is one more
``For(kind)`` controller with its own cache, queue and workers, sharing the owned caches: an owned
object's event goes to every controller, and the one whose kind owns it queues it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.informer import Informer, JobInformer
from volcano_job_webhook.kube.rest import Rest, widen_pool
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, ObjectKey, by_resource

from .controller import Controller
from .events import EventRecorder
from .jobs import JobReconciler
from .kinds import MANAGED_SELECTOR, OWNED, OwnedRecord, resource
from .metrics import ReconcilerMetrics
from .workloads import WorkloadRecord
from .workqueue import WorkQueue
from .writer import ObjectWriter

log = logging.getLogger(__name__)


def served_workloads(api: client.ApiClient, kinds: Iterable[str], attempts: int = 3, pause: float = 1.0) -> list[str]:
    """The workload kinds of ``kinds`` the API server serves (JobSet's CRD may not be installed:
    its cache would never fill). A kind whose discovery keeps failing otherwise (the API server
    away at start) is kept: its cache lists once the server answers."""
    rest, served = Rest(api), []
    for name in kinds:
        kind = by_resource(name)
        for attempt in range(attempts):
            try:
                rest.call("GET", f"/apis/{kind.api_version}")
            except ApiException as exc:
                if exc.status == 404:
                    log.warning("%s is not served by the API server: %s are not reconciled (restart once it is "
                                "installed)", kind.api_version, name)
                    break
                problem: Exception = exc
            except Exception as exc:  # the API server unreachable
                problem = exc
            else:
                served.append(name)
                break
            if attempt + 1 == attempts:
                log.warning("could not ask whether %s is served (%s): %s are reconciled as if it were",
                            kind.api_version, problem, name)
                served.append(name)
            else:
                time.sleep(pause)
    return served


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
        workloads: Iterable[str] = (),
    ) -> None:
        self.metrics = metrics = metrics or ReconcilerMetrics()
        self.namespaces = list(namespaces)
        workloads = [kind for kind in workloads if kind != VOLCANO_JOB.resource]
        watches = len(self.namespaces or [""]) * (1 + len(OWNED) + len(workloads))
        widen_pool(api, watches + workers * 4 * (1 + len(workloads)) + 4)
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
        chain = chain or Chain()
        self.job_reconciler = JobReconciler(VOLCANO_JOB, self.jobs, self.owned, chain, self.writer, self.events, metrics, may_write)
        self.controller = Controller(self.jobs, self.owned, self.job_reconciler.reconcile, resync_seconds=resync_seconds,
                                     workers=workers, is_leader=is_leader, metrics=metrics, on_synced=on_synced,
                                     owners=self.job_reconciler.owners)
        self.jobs.on_event = self.controller.on_primary
        # The other kinds: a cache, a reconciler and a controller each, the owned caches shared.
        self.reconcilers: dict[str, JobReconciler] = {VOLCANO_JOB.resource: self.job_reconciler}
        self.controllers: list[Controller] = [self.controller]
        for kind in workloads:
            informer: Informer[Any] = Informer(api, resource(by_resource(kind)), self.namespaces, transform=WorkloadRecord)
            reconciler = JobReconciler(by_resource(kind), informer, self.owned, chain, self.writer, self.events, metrics, may_write)
            controller = Controller(informer, self.owned, reconciler.reconcile, resync_seconds=resync_seconds,
                                    workers=workers, is_leader=is_leader, metrics=metrics, owners=reconciler.owners,
                                    start_owned=False)
            informer.on_event = controller.on_primary
            self.reconcilers[kind] = reconciler
            self.controllers.append(controller)
        for kind, informer in self.owned.items():
            informer.on_event = _fan_out([c.owned_handler(kind, r.on_owned)
                                          for c, r in zip(self.controllers, self.reconcilers.values(), strict=True)])
        metrics.cached_jobs.set_function(lambda: len(self.jobs))
        for kind, informer in self.owned.items():
            metrics.cached_objects.labels(kind).set_function(informer.__len__)

    @property
    def queue(self) -> WorkQueue:
        return self.controller.queue

    @property
    def ready(self) -> bool:
        return all(controller.ready for controller in self.controllers)

    def start(self) -> None:
        for controller in self.controllers:
            controller.start()

    def stop(self, timeout: float = 1.5) -> None:
        """Stop taking work and writing at once; give in-flight reconciles ``timeout`` to finish."""
        self._stopping.set()
        for controller in reversed(self.controllers):  # the one that stops the shared caches last
            controller.stop(timeout)
        self.writer.close()

    def leadership_changed(self, leading: bool) -> None:
        for controller in self.controllers:
            controller.leadership_changed(leading)

    def resync(self) -> int:
        return sum(controller.resync() for controller in self.controllers)



def _owner(record: OwnedRecord) -> ObjectKey | None:
    return record.owner


def _fan_out(handlers: list[Callable[[str, Any], None]]) -> Callable[[str, Any], None]:
    if len(handlers) == 1:
        return handlers[0]

    def on_event(event: str, obj: Any) -> None:
        for handler in handlers:
            handler(event, obj)
    return on_event
