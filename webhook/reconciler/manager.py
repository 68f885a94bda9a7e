"""``volcano-webhook reconcile``'s controllers, in controller-runtime's shape.

:class:`Manager` holds the caches every controller shares — one informer per kind of the table
(:mod:`volcano_job_webhook.plugins.kinds`), made on first use with what the kind's ``cached``
column says is kept of it (:data:`TRANSFORMS`) — and starts, stops and resyncs them and the
controllers together. :func:`build` is the builder: ``build(manager, for_=kind, owns=kinds,
reconcile=...)`` is ``For(kind).Owns(kinds...).Complete(reconcile)``. An owned kind's one cache
routes each event, by the kind of the object's controller reference, to the one controller for
that kind (``EnqueueRequestForOwner``): one dict lookup per event, whatever the number of
controllers.

:class:`Reconciler` is the process's: a controller for Volcano Jobs and one for each workload kind
that may opt in (Indexed Jobs, JobSets: docs/workloads.md), each ``For(kind).Owns(ConfigMap, Secret,
Service, NetworkPolicy)`` with a :class:`~.jobs.JobReconciler`, sharing the writer and the event
recorder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.informer import EventHandler, Informer
from volcano_job_webhook.kube.records import JobRecord
from volcano_job_webhook.kube.rest import Rest, widen_pool
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.plugins.kinds import OWNED, SECRET, VOLCANO_JOB, Cached, Kind, ObjectKey, by_resource

from .controller import Controller, OwnedObserver, Reconcile
from .events import EventRecorder
from .jobs import JobReconciler
from .kinds import MANAGED_SELECTOR, OwnedRecord, controlling
from .metrics import ReconcilerMetrics
from .workloads import WorkloadRecord
from .workqueue import WorkQueue
from .writer import ObjectWriter

log = logging.getLogger(__name__)

# What a cache keeps of each kind, by the table's ``cached`` column: the one place kinds meet records.
TRANSFORMS: dict[Cached, Callable[[dict[str, Any]], Any]] = {
    Cached.JOB: JobRecord,
    Cached.WORKLOAD: WorkloadRecord,
    Cached.OWNED: OwnedRecord,
}


class Manager:
    """The shared caches, by kind, and the controllers built on them (:func:`build`). ``is_leader``
    gates every controller's work; ``on_synced`` is called once, when every cache has listed."""

    def __init__(self, api: client.ApiClient, namespaces: Iterable[str] = (), *, is_leader: Callable[[], bool] = lambda: True,
                 metrics: ReconcilerMetrics | None = None, on_synced: Callable[[], None] | None = None) -> None:
        self.api = api
        self.namespaces = list(namespaces)
        self.is_leader = is_leader
        self.metrics = metrics or ReconcilerMetrics()
        self.on_synced = on_synced
        self.caches: dict[Kind, Informer[Any]] = {}
        self.controllers: dict[Kind, Controller] = {}
        # By owned kind: the controller each of its objects' controlling kind routes to.
        self._owners: dict[Kind, dict[Kind, OwnedObserver]] = {}
        self._synced = False
        self._lock = threading.Lock()
        self.metrics.queue_depth.set_function(lambda: sum(len(c.queue) for c in self.controllers.values()))

    def cache(self, kind: Kind) -> Informer[Any]:
        """``kind``'s cache, made the first time it is asked for (not started: :meth:`start` does)."""
        found = self.caches.get(kind)
        if found is not None:
            return found
        if kind.cached is Cached.OWNED:
            # Only our labelled objects, indexed by the workload that controls them. A deleted
            # Secret's last state is reported too: an SSH Secret comes back with the keys the
            # job's running Pods hold (jobs.py).
            found = Informer(self.api, kind, self.namespaces, transform=OwnedRecord, label_selector=MANAGED_SELECTOR,
                             index=_owner, deleted_objects=kind is SECRET)
            found.add_event_handler(self._enqueue_for_owner(kind))
        else:
            found = Informer(self.api, kind, self.namespaces, transform=TRANSFORMS[kind.cached])
        self.caches[kind] = found
        return found

    def _enqueue_for_owner(self, kind: Kind) -> EventHandler:
        """An owned cache's one handler: each event to the controller for the kind of the object's
        controller reference, with that object's key (controller-runtime's EnqueueRequestForOwner)."""
        routes = self._owners.setdefault(kind, {})
        name = kind.kind

        def on_event(event: str, obj: Any) -> None:
            if isinstance(obj, OwnedRecord):
                owner_kind, owner = obj.owner_kind, obj.owner
            else:  # a deleted object as it was (deleted_objects)
                owner_kind, owner, _ = controlling(obj)
            route = routes.get(owner_kind) if owner_kind is not None else None
            if route is not None and owner is not None:
                route(name, event, obj, owner)
        return on_event

    def owners(self, kind: Kind) -> set[ObjectKey]:
        """The keys of the objects of ``kind`` that control a cached owned object."""
        return {record.owner for owned, routes in self._owners.items() if kind in routes
                for record in self.caches[owned].items() if record.owner_kind is kind}

    @property
    def ready(self) -> bool:
        return all(controller.ready for controller in self.controllers.values())

    def _controller_synced(self) -> None:
        with self._lock:
            if self._synced or not self.ready:
                return
            self._synced = True
        if self.on_synced is not None:
            self.on_synced()

    def start(self) -> None:
        for cache in self.caches.values():
            cache.start()
        for controller in self.controllers.values():
            controller.start()

    def stop(self, timeout: float = 1.5) -> None:
        """Stop taking work and watching at once; give in-flight reconciles ``timeout`` to finish."""
        deadline = time.monotonic() + timeout
        for controller in self.controllers.values():
            controller.cancel()
        for cache in self.caches.values():
            cache.cancel()
        for controller in self.controllers.values():
            controller.join(deadline)
        for cache in self.caches.values():
            cache.join(deadline)

    def leadership_changed(self, leading: bool) -> None:
        for controller in self.controllers.values():
            controller.leadership_changed(leading)

    def resync(self) -> int:
        return sum(controller.resync() for controller in self.controllers.values())


def build(manager: Manager, for_: Kind, owns: Iterable[Kind], reconcile: Reconcile, *, observe: OwnedObserver | None = None,
          workers: int = 4, resync_seconds: float = 300.0) -> Controller:
    """controller-runtime's builder, ``For(for_).Owns(owns...).Complete(reconcile)``: a controller
    on the manager's caches of ``for_`` and of each owned kind, whose queue takes the key of every
    object of ``for_`` that changes and of every one that controls an owned object that changes
    (``observe`` is told of the latter first)."""
    if for_ in manager.controllers:
        raise ValueError(f"a controller for {for_.resource} is built already")
    owns = list(owns)
    for kind in owns:
        if kind.cached is not Cached.OWNED:
            raise ValueError(f"{kind.resource} is not a kind the table says is owned")
    primary = manager.cache(for_)
    controller = Controller(for_, primary, [manager.cache(kind) for kind in owns], reconcile, observe=observe,
                            owners=lambda: manager.owners(for_), resync_seconds=resync_seconds, workers=workers,
                            is_leader=manager.is_leader, metrics=manager.metrics, on_synced=manager._controller_synced)
    primary.add_event_handler(controller.on_primary)
    for kind in owns:
        manager._owners[kind][for_] = controller.on_owned
    manager.controllers[for_] = controller
    return controller


def served_workloads(api: client.ApiClient, kinds: Iterable[str], attempts: int = 3, pause: float = 1.0) -> list[str]:
    """The workload kinds of ``kinds`` (resource names, as the setting ``workloads`` holds them) the
    API server serves (JobSet's CRD may not be installed: its cache would never fill). A kind whose
    discovery keeps failing otherwise (the API server away at start) is kept: its cache lists once
    the server answers."""
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
    """The process's controllers: ``For(kind).Owns(ConfigMap, Secret, Service, NetworkPolicy)`` with
    a :class:`~.jobs.JobReconciler` for Volcano Jobs and for each of ``workloads`` (resource names),
    on one :class:`Manager`. ``is_leader`` gates every write."""

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
        kinds = list(dict.fromkeys([VOLCANO_JOB, *map(by_resource, workloads)]))
        namespaces = list(namespaces)
        # Every watch holds a connection for its life; each controller's workers write several objects at once.
        widen_pool(api, len(namespaces or [""]) * (len(kinds) + len(OWNED)) + workers * 4 * len(kinds) + 4)
        rest = Rest(api)
        self._stopping = threading.Event()

        def may_write() -> bool:
            # Stopping: a reconcile with many writes left ends at its next one (the next leader redoes it).
            return not self._stopping.is_set() and is_leader()

        self.manager = manager = Manager(api, namespaces, is_leader=is_leader, metrics=metrics, on_synced=on_synced)
        owned = {kind.kind: manager.cache(kind) for kind in OWNED}
        self.events = EventRecorder(rest, metrics, is_leader)
        self.writer = ObjectWriter(rest, owned, metrics, self.events, may_write, threads=workers * 4)
        chain = chain or Chain()
        for kind in kinds:
            reconciler = JobReconciler(kind, manager.cache(kind), owned, chain, self.writer, self.events, metrics, may_write)
            build(manager, for_=kind, owns=OWNED, reconcile=reconciler.reconcile, observe=reconciler.on_owned,
                  workers=workers, resync_seconds=resync_seconds)
        metrics.cached_jobs.set_function(lambda: len(self.jobs))
        for name, cache in owned.items():
            metrics.cached_objects.labels(name).set_function(cache.__len__)

    @property
    def jobs(self) -> Informer[Any]:
        """The Volcano Jobs' cache."""
        return self.manager.caches[VOLCANO_JOB]

    @property
    def queue(self) -> WorkQueue[ObjectKey]:
        """The Volcano Jobs' work queue."""
        return self.manager.controllers[VOLCANO_JOB].queue

    @property
    def ready(self) -> bool:
        return self.manager.ready

    def start(self) -> None:
        self.manager.start()

    def stop(self, timeout: float = 1.5) -> None:
        """Stop taking work and writing at once; give in-flight reconciles ``timeout`` to finish."""
        self._stopping.set()
        self.manager.stop(timeout)
        self.writer.close()

    def leadership_changed(self, leading: bool) -> None:
        self.manager.leadership_changed(leading)

    def resync(self) -> int:
        return self.manager.resync()


def _owner(record: OwnedRecord) -> ObjectKey | None:
    return record.owner
