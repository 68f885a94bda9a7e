"""A controller that knows nothing of jobs: controller-runtime's ``Controller`` in our terms.

It watches a primary kind and the kinds it owns (informers, :mod:`volcano_job_webhook.kube.informer`),
turns every event into a key on a rate-limited work queue (an event on a primary object queues its
key; one on an owned object, the key its handler names — its owner's), and runs ``reconcile(key)``
on ``workers`` threads, never one key on two at once. A resync queues every key the caches know at
low priority — periodically, and at once when this replica gains leadership; watch events go first.
Workers reconcile only while this replica leads (``is_leader``); keys wait in the queue meanwhile.

The user writes only ``reconcile(key)``, which raises to be retried with backoff, or
:class:`NotLeading` to be handed, without a retry, to whoever leads next.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.informer import LISTED, Informer
from volcano_job_webhook.plugins.kinds import ObjectKey

from .metrics import ReconcilerMetrics
from .workqueue import WorkQueue

log = logging.getLogger(__name__)

Key = Hashable
# An owned object's event → the key to queue (its owner's), or None for an object no primary owns.
OwnedHandler = Callable[[str, str, Any], Key | None]


class NotLeading(RuntimeError):
    """A write not sent: this replica stopped leading (or is stopping)."""


class Controller:
    """``For(primary).Owns(owned...)`` with ``reconcile`` run by ``workers`` threads."""

    def __init__(
        self,
        primary: Informer[Any],
        owned: Mapping[str, Informer[Any]],
        reconcile: Callable[[Any], None],
        *,
        resync_seconds: float = 300.0,
        workers: int = 4,
        is_leader: Callable[[], bool] = lambda: True,
        metrics: ReconcilerMetrics | None = None,
        on_synced: Callable[[], None] | None = None,
        owners: Callable[[], Iterable[Key]] = set,
        start_owned: bool = True,
    ) -> None:
        self.primary = primary
        self.owned = dict(owned)
        # Several controllers may share the owned caches (one per primary kind): each resyncs the
        # owners that are its own, and one of them starts and stops the caches.
        self.owners = owners
        self.start_owned = start_owned
        self.reconcile = reconcile
        self.resync_seconds = resync_seconds
        self.workers = workers
        self.is_leader = is_leader
        self.metrics = metrics or ReconcilerMetrics()
        # Called once, when every cache has listed (the process settles its memory then).
        self.on_synced = on_synced
        self.queue = WorkQueue()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self.metrics.queue_depth.set_function(lambda: len(self.queue))

    # Event handlers the informers call -----------------------------------------------------------

    def on_primary(self, event: str, record: Any) -> None:
        # What the first list finds is no news (as controller-runtime's priority queue treats its
        # initial list): low priority, so a change made meanwhile is not behind all of them.
        self.queue.add(ObjectKey._make(record.key), low=event == LISTED)

    def owned_handler(self, kind: str, handler: OwnedHandler) -> Callable[[str, Any], None]:
        """The ``on_event`` of ``kind``'s informer: ``handler`` names the key, which is queued."""
        def on_event(event: str, obj: Any) -> None:
            key = handler(kind, event, obj)
            if key is not None:
                self.queue.add(key, low=event == LISTED)
        return on_event

    # Lifecycle -----------------------------------------------------------------------------------

    @property
    def informers(self) -> list[Informer[Any]]:
        """The caches this controller starts and stops."""
        return [self.primary, *self.owned.values()] if self.start_owned else [self.primary]

    @property
    def ready(self) -> bool:
        return self.primary.synced and all(informer.synced for informer in self.owned.values())

    def start(self) -> None:
        for informer in self.informers:
            informer.start()
        for i in range(self.workers):
            self._spawn(self._work, f"reconcile-worker-{i}")
        self._spawn(self._resync_loop, "reconcile-resync")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, timeout: float = 1.5) -> None:
        """Stop taking work and watching at once; give in-flight reconciles ``timeout`` to finish."""
        self._stop.set()
        self._wake.set()
        self.queue.shutdown()
        for informer in self.informers:
            informer.cancel()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for informer in self.informers:
            informer.join(deadline)

    def leadership_changed(self, leading: bool) -> None:
        """Called by the leader elector: on gaining leadership every key is queued at once."""
        if leading:
            self._wake.set()

    # Resync --------------------------------------------------------------------------------------

    def resync(self) -> int:
        """Queue, at low priority, every primary key and the owner of every cached owned object
        (primaries deleted while nobody watched leave such orphans). From the caches: no API call.
        Returns the count."""
        keys: set[Key] = {ObjectKey._make(record.key) for record in self.primary.items()}
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
                log.info("resync: %d keys queued%s", count, "" if was_leader else " (leadership gained)")
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
                log.warning("reconcile of %s failed (%s); retrying in %.2fs", _show(key), describe(exc), delay)
            finally:
                self.queue.done(key)


def _show(key: Key) -> str:
    return "/".join(key) if isinstance(key, tuple) and all(isinstance(k, str) for k in key) else repr(key)


def describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if isinstance(exc, ApiException) and status:
        return f"HTTP {status}"
    return str(exc) or type(exc).__name__


