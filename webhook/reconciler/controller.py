"""controller-runtime's ``Controller``, knowing nothing of jobs: ``workers`` threads run ``reconcile(key)``
on a rate-limited work queue (never one key in two at once), and a resync queues every key of ``keys()``
at low priority, at start and every ``resync_seconds``. ``reconcile`` returns None or seconds until the
key is looked at again; what it raises requeues the key with backoff (a ``Retry-After`` honoured).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from volcano_job_webhook.kube.backoff import describe, retry_after
from volcano_job_webhook.kube.informer import LISTED, Informer

from .metrics import ReconcilerMetrics
from .workqueue import WorkQueue

log = logging.getLogger(__name__)

Reconcile = Callable[[Any], float | None]


class Controller:
    """``reconcile`` run by ``workers`` threads once every cache of ``caches`` has listed."""

    def __init__(self, name: str, caches: Sequence[Informer[Any]], reconcile: Reconcile, *, keys: Callable[[], Iterable[Hashable]],
                 resync_seconds: float, workers: int, metrics: ReconcilerMetrics | None = None) -> None:
        self.name = name
        self.caches = list(caches)
        self.reconcile = reconcile
        self.keys = keys
        self.resync_seconds = resync_seconds
        self.workers = workers
        self.metrics = metrics
        self.queue: WorkQueue[Hashable] = WorkQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def enqueue(self, key: Hashable, event: str = "") -> None:
        """Queue ``key`` for an event: what a first list found at low priority (no news, as
        controller-runtime's priority queue treats its initial list), any change ahead of it."""
        self.queue.add(key, low=event == LISTED)

    def start(self) -> None:
        for target, name in [*((self._work, f"{self.name}-{i}") for i in range(self.workers)), (self._resync_loop, f"{self.name}-resync")]:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def cancel(self) -> None:
        """Stop taking work at once, without waiting."""
        self._stop.set()
        self.queue.shutdown()

    def join(self, deadline: float) -> None:
        """Wait for in-flight reconciles to end, until ``deadline`` (``time.monotonic()``)."""
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def resync(self) -> int:
        """Queue every key at low priority, from the caches (no API call); returns how many."""
        keys = set(self.keys())
        for key in keys:
            self.queue.add(key, low=True)
        return len(keys)

    def _wait_ready(self) -> bool:
        """Wait until every cache it reads has listed; False when stopped first."""
        while not all(cache.synced for cache in self.caches):
            if self._stop.wait(0.05):
                return False
        return True

    def _resync_loop(self) -> None:
        if not self._wait_ready():
            return
        while True:
            log.info("resync: %d %s keys queued", self.resync(), self.name)
            if self._stop.wait(self.resync_seconds):
                return

    def _work(self) -> None:
        if not self._wait_ready():
            return
        while (key := self.queue.get()) is not None:
            result = "success"
            try:
                again = self.reconcile(key)
                self.queue.forget(key)
                if again is not None:
                    self.queue.add_after(key, again)
            except Exception as exc:
                result = "error"
                wait = self.queue.add_rate_limited(key, retry_after(exc) or 0.0)
                log.warning("reconcile of %s %s failed (%s); retrying in %.2fs", self.name, key, describe(exc), wait)
            finally:
                self.queue.done(key)
            if self.metrics is not None:
                self.metrics.reconciles.labels(result).inc()
