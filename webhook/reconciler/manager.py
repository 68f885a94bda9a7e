"""``volcano-webhook reconcile``'s controllers in controller-runtime's shape: a :class:`Manager` of shared
caches (every replica) and controllers (the leader's), :func:`build`, and the process's :class:`Reconciler`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

from kubernetes import client

from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.kube.informer import EventHandler, Informer
from volcano_job_webhook.kube.rest import Rest, widen_pool
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.plugins.kinds import SECRET, VOLCANO_JOB, Kind, ObjectKey, by_resource

from .controller import Controller, Reconcile
from .events import EventRecorder
from .metrics import ReconcilerMetrics
from .owned import MANAGED_SELECTOR, OWNED, controlling
from .transforms import TRANSFORMS, OwnedRecord
from .workload import WorkloadReconciler
from .writer import ObjectWriter

# Told of an owned object's event before its owner's key is queued: (owned kind, event, object, owner).
OwnedObserver = Callable[[str, str, Any, ObjectKey], None]


class Manager:
    """The shared caches and the controllers on them; ``on_synced`` is called once every cache has listed."""

    def __init__(self, api: client.ApiClient, namespaces: Iterable[str] = (), *, on_synced: Callable[[], None] | None = None) -> None:
        self.api = api
        self.namespaces = list(namespaces)
        self.on_synced = on_synced
        self.caches: dict[Kind, Informer[Any]] = {}
        self.informers: list[Informer[Any]] = []
        self.controllers: list[Controller] = []
        # By owned kind: the controller each of its objects' controlling kind routes to.
        self._routes: dict[Kind, dict[Kind, OwnedObserver]] = {}
        self._lock = threading.Lock()
        self._synced = self._leading = False

    def informer(self, kind: Kind, namespaces: Iterable[str] | None = None, **options: Any) -> Informer[Any]:
        """A new cache of ``kind`` (in ``namespaces``, by default the manager's), started with the others."""
        found: Informer[Any] = Informer(self.api, kind, self.namespaces if namespaces is None else namespaces,
                                        on_synced=self._cache_synced, **options)
        self.informers.append(found)
        return found

    def cache(self, kind: Kind) -> Informer[Any]:
        """The shared cache of a kind of the table, made the first time it is asked for."""
        found = self.caches.get(kind)
        if found is None:
            if kind in OWNED.values():
                # Only our labelled objects, by controlling workload; a deleted Secret comes whole (see workload.py).
                found = self.informer(kind, transform=OwnedRecord, label_selector=MANAGED_SELECTOR, index=attrgetter("workload"),
                                      deleted_objects=kind is SECRET)
                found.add_event_handler(self._enqueue_for_owner(kind))
            else:
                found = self.informer(kind, transform=TRANSFORMS[kind])
            self.caches[kind] = found
        return found

    def controller(self, name: str, caches: Iterable[Informer[Any]], reconcile: Reconcile, **options: Any) -> Controller:
        """A controller on these caches, started when this replica leads."""
        found = Controller(name, list(caches), reconcile, **options)
        self.controllers.append(found)
        return found

    def _enqueue_for_owner(self, kind: Kind) -> EventHandler:
        """An owned cache's one handler: each event to the controller for the kind of the object's
        controller reference, with that object's key (controller-runtime's EnqueueRequestForOwner)."""
        routes = self._routes.setdefault(kind, {})

        def on_event(event: str, obj: Any) -> None:
            workload_kind, workload = (obj.workload_kind, obj.workload) if isinstance(obj, OwnedRecord) else controlling(obj)[:2]
            route = routes.get(workload_kind) if workload_kind is not None else None
            if route is not None and workload is not None:
                route(kind.kind, event, obj, workload)
        return on_event

    def owners(self, kind: Kind) -> set[ObjectKey]:
        """The keys of the objects of ``kind`` that control a cached owned object."""
        return {record.workload for owned, routes in self._routes.items() if kind in routes
                for record in self.caches[owned].items() if record.workload_kind is kind}

    @property
    def ready(self) -> bool:
        return all(informer.synced for informer in self.informers)

    def _cache_synced(self) -> None:
        with self._lock:
            if self._synced or not self.ready:
                return
            self._synced = True
        if self.on_synced is not None:
            self.on_synced()

    def start(self) -> None:
        """Start the caches (every replica)."""
        for informer in self.informers:
            informer.start()

    def lead(self) -> None:
        """Start the controllers, once (the leader only: a replica that loses the lease exits)."""
        with self._lock:
            leading, self._leading = self._leading, True
        for controller in [] if leading else self.controllers:
            controller.start()

    def stop(self, timeout: float = 1.5) -> None:
        """Stop taking work and watching at once; give in-flight reconciles ``timeout`` to finish."""
        deadline = time.monotonic() + timeout
        everything: tuple[Any, ...] = (*self.controllers, *self.informers)  # each has cancel() and join(deadline)
        for running in everything:
            running.cancel()
        for running in everything:
            running.join(deadline)


def build(manager: Manager, for_: Kind, owns: Iterable[Kind], reconcile: Reconcile, *, observe: OwnedObserver | None = None,
          **options: Any) -> Controller:
    """controller-runtime's ``For(for_).Owns(owns...).Complete(reconcile)``: a controller queued with the
    key of each changed object of ``for_`` and of the controller of each changed owned object (``observe``
    is told of that first); ``options`` are the :class:`Controller`'s."""
    owns = list(owns)
    if any(c.name == for_.resource for c in manager.controllers):
        raise ValueError(f"a controller for {for_.resource} is built already")
    for kind in owns:
        if kind not in OWNED.values():
            raise ValueError(f"{kind.resource} is not a kind of side object")
    primary = manager.cache(for_)
    controller = manager.controller(for_.resource, [primary, *map(manager.cache, owns)], reconcile,
                                    keys=lambda: {record.key for record in primary.items()} | manager.owners(for_), **options)
    primary.add_event_handler(lambda event, record: controller.enqueue(record.key, event))

    def on_owned(kind: str, event: str, obj: Any, owner: ObjectKey) -> None:
        if observe is not None:
            observe(kind, event, obj, owner)
        controller.enqueue(owner, event)

    for kind in owns:
        manager._routes[kind][for_] = on_owned
    return controller


class Reconciler:
    """The process's controllers on one :class:`Manager`: ``For(kind).Owns(OWNED)`` with a
    :class:`~.workload.WorkloadReconciler` for Volcano Jobs and each of the settings' ``workloads``."""

    def __init__(self, api: client.ApiClient, settings: WebhookSettings, chain: Chain | None = None, *,
                 metrics: ReconcilerMetrics | None = None, on_synced: Callable[[], None] | None = None) -> None:
        self.metrics = metrics = metrics or ReconcilerMetrics()
        kinds = list(dict.fromkeys([VOLCANO_JOB, *map(by_resource, settings.workloads)]))
        # Every watch holds a connection for its life (the registration's few too); each controller's
        # workers write several objects at once.
        widen_pool(api, len(settings.namespaces or [""]) * (len(kinds) + len(OWNED)) + settings.workers * 4 * len(kinds) + 12)
        self.manager = manager = Manager(api, settings.namespaces, on_synced=on_synced)
        owned = {name: manager.cache(kind) for name, kind in OWNED.items()}
        self.events = EventRecorder(Rest(api), metrics)
        self.writer = ObjectWriter(Rest(api), metrics, self.events, threads=settings.workers * 4)
        chain = chain or settings.chain(on_cluster=True)
        for kind in kinds:
            reconciler = WorkloadReconciler(kind, manager.cache(kind), owned, chain, self.writer, self.events, metrics)
            build(manager, for_=kind, owns=OWNED.values(), reconcile=reconciler.reconcile, observe=reconciler.on_owned,
                  workers=settings.workers, resync_seconds=settings.resync_seconds, metrics=metrics)
        metrics.cached_jobs.set_function(manager.cache(VOLCANO_JOB).__len__)
        # Ready keys only: a key held back on purpose (a backoff, a registration's next look) is no
        # stalled work, and VolcanoJobWebhookReconcilerStalled read it as such on a healthy install.
        metrics.queue_depth.set_function(lambda: sum(c.queue.depth for c in manager.controllers))
        for name, cache in owned.items():
            metrics.cached_objects.labels(name).set_function(cache.__len__)

    def start(self, leading: bool = True) -> None:
        """Start the caches, and the controllers too unless this replica waits for the lease (``manager.lead``)."""
        self.manager.start()
        if leading:
            self.manager.lead()

    def stop(self, timeout: float = 1.5) -> None:
        """Stop taking work and writing at once; give in-flight reconciles ``timeout`` to finish."""
        self.writer.close()
        self.manager.stop(timeout)
