"""A controller that knows nothing of jobs: controller-runtime's ``Controller`` in our terms.

One per kind it is *for*: a rate-limited work queue of :class:`~volcano_job_webhook.plugins.kinds.ObjectKey`
fed by the manager's shared caches (:mod:`.manager`: an event on an object of its kind queues the
object's key, one on an owned object the key of the object of its kind that controls it), and
``workers`` threads running ``reconcile(request)``, never one key on two at once. A resync queues
every key the caches know at low priority — periodically, and at once when this replica gains
leadership; watch events go first. Workers reconcile only while this replica leads
(``is_leader``); keys wait in the queue meanwhile.

The user writes only ``reconcile(request)``, which raises to be retried with backoff, or
:class:`NotLeading` to be handed, without a retry, to whoever leads next.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.informer import LISTED, Informer
from volcano_job_webhook.plugins.kinds import Kind, ObjectKey

from .metrics import ReconcilerMetrics
from .workqueue import WorkQueue

log = logging.getLogger(__name__)

Reconcile = Callable[[ObjectKey], None]
# Told of an owned object's event before its owner's key is queued: (owned kind, event, object, owner).
OwnedObserver = Callable[[str, str, Any, ObjectKey], None]


class NotLeading(RuntimeError):
    """A write not sent: this replica stopped leading (or is stopping)."""


class Controller:
    """``reconcile`` run by ``workers`` threads on the keys of ``kind``'s objects; ``primary`` and
    ``owned`` are the caches it waits for, ``owners`` what a resync adds to the primary keys (the
    keys of the objects of ``kind`` that control a cached owned object)."""

    def __init__(
        self,
        kind: Kind,
        primary: Informer[Any],
        owned: Sequence[Informer[Any]],
        reconcile: Reconcile,
        *,
        owners: Callable[[], Iterable[ObjectKey]] = tuple,
        observe: OwnedObserver | None = None,
        resync_seconds: float = 300.0,
        workers: int = 4,
        is_leader: Callable[[], bool] = lambda: True,
        metrics: ReconcilerMetrics | None = None,
        on_synced: Callable[[], None] | None = None,
    ) -> None:
        self.kind = kind
        self.primary = primary
        self.owned = list(owned)
        self.reconcile = reconcile
        self.owners = owners
        self.observe = observe
        self.resync_seconds = resync_seconds
        self.workers = workers
        self.is_leader = is_leader
        self.metrics = metrics or ReconcilerMetrics()
        # Called once this controller's caches have listed.
        self.on_synced = on_synced
        self.queue: WorkQueue[ObjectKey] = WorkQueue()
        self._ready = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []

    # Event handlers ------------------------------------------------------------------------------

    def on_primary(self, event: str, record: Any) -> None:
        """An event on an object of its kind (the primary cache's handler)."""
        # What the first list finds is no news (as controller-runtime's priority queue treats its
        # initial list): low priority, so a change made meanwhile is not behind all of them.
        self.queue.add(record.key, low=event == LISTED)

    def on_owned(self, kind: str, event: str, obj: Any, owner: ObjectKey) -> None:
        """An event on an object that ``owner``, of this controller's kind, controls (routed by
        the manager's owned cache)."""
        if self.observe is not None:
            self.observe(kind, event, obj, owner)
        self.queue.add(owner, low=event == LISTED)

    # Lifecycle -----------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Every cache it reads has listed (and stays so: a cache once synced is never unsynced)."""
        if not self._ready:
            self._ready = self.primary.synced and all(informer.synced for informer in self.owned)
        return self._ready

    def start(self) -> None:
        """Start the workers and the resync; the caches are the manager's to start."""
        for i in range(self.workers):
            self._spawn(self._work, f"reconcile-{self.kind.plural}-{i}")
        self._spawn(self._resync_loop, f"resync-{self.kind.plural}")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def cancel(self) -> None:
        """Stop taking work at once, without waiting."""
        self._stop.set()
        self._wake.set()
        self.queue.shutdown()

    def join(self, deadline: float) -> None:
        """Wait for in-flight reconciles to end, until ``deadline`` (``time.monotonic()``)."""
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def leadership_changed(self, leading: bool) -> None:
        """Called by the leader elector: on gaining leadership every key is queued at once."""
        if leading:
            self._wake.set()

    # Resync --------------------------------------------------------------------------------------

    def resync(self) -> int:
        """Queue, at low priority, every primary key and every owner of a cached owned object
        (objects of its kind deleted while nobody watched leave such orphans). From the caches: no
        API call. Returns the count."""
        keys = {record.key for record in self.primary.items()}
        keys.update(self.owners())
        for key in keys:
            self.queue.add(key, low=True)
        return len(keys)

    def _resync_loop(self) -> None:
        while not self._stop.is_set() and not self.ready:
            self._stop.wait(0.05)
        if self.on_synced is not None and not self._stop.is_set():
            self.on_synced()
        last: float | None = None
        was_leader = False
        while not self._stop.is_set():
            leading = self.is_leader()
            due = last is None or time.monotonic() - last >= self.resync_seconds
            if leading and (due or not was_leader):
                count = self.resync()
                last = time.monotonic()
                log.info("resync: %d %s keys queued%s", count, self.kind.resource, "" if was_leader else " (leadership gained)")
            was_leader = leading
            # Woken at once by leadership_changed; polling is_leader too covers electors that do not call it.
            self._wake.wait(0.2)
            self._wake.clear()

    # Workers -------------------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            if not (self.ready and self.is_leader()):
                # Not ours to write now: keys wait in the queue (at most one entry per key).
                self._stop.wait(0.1)
                continue
            key = self.queue.get(timeout=0.2)
            if key is None:
                continue
            try:
                if not self.is_leader():
                    self.queue.add(key)
                    continue
                self.reconcile(key)
                self.queue.forget(key)
                self.metrics.reconciles.labels("success").inc()
            except NotLeading:
                self.queue.add(key)  # the next leader (this replica again, or another) does it
            except Exception as exc:
                delay = self.queue.add_rate_limited(key)
                self.metrics.reconciles.labels("error").inc()
                log.warning("reconcile of %s %s failed (%s); retrying in %.2fs", self.kind.noun, key, describe(exc), delay)
            finally:
                self.queue.done(key)


def describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if isinstance(exc, ApiException) and status:
        return f"HTTP {status}"
    return str(exc) or type(exc).__name__
