"""client-go's rate-limited work queue: a key waits at most once, is handled by one worker at a time (again
after :meth:`WorkQueue.done` if added meanwhile), and comes back after a growing delay when it fails; a key
asked for later is held once, at the earliest time asked. Watch events' keys go before a resync's
(``low``), as in controller-runtime's priority queue.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from volcano_job_webhook.kube.backoff import delay

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """The queue of one controller's keys."""

    def __init__(self, base_delay: float = 0.05, max_delay: float = 60.0) -> None:
        self._cond = threading.Condition()
        self._high: OrderedDict[K, None] = OrderedDict()
        self._low: OrderedDict[K, None] = OrderedDict()
        # Keys waiting (in a queue, or being handled and queued again on done) → whether at low priority.
        self._dirty: dict[K, bool] = {}
        self._processing: set[K] = set()
        self._delayed: list[tuple[float, int, K]] = []  # a heap; an entry no longer in _waiting is stale
        self._waiting: dict[K, float] = {}  # each key held back → when it is due
        self._failures: dict[K, int] = {}
        self._counter = 0
        self._shutdown = False
        self.base_delay, self.max_delay = base_delay, max_delay

    def add(self, key: K, *, low: bool = False) -> None:
        with self._cond:
            self._add(key, low)

    def _add(self, key: K, low: bool) -> None:
        if self._shutdown:
            return
        if key in self._dirty:
            if not low and self._dirty[key]:
                self._dirty[key] = False
                if self._low.pop(key, 0) is None:
                    self._high[key] = None
            return
        self._dirty[key] = low
        if key not in self._processing:
            (self._low if low else self._high)[key] = None
            self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        due = time.monotonic() + delay
        with self._cond:
            if self._waiting.get(key, due) < due:
                return
            self._waiting[key] = due
            self._counter += 1
            heapq.heappush(self._delayed, (due, self._counter, key))
            self._cond.notify()

    def add_rate_limited(self, key: K, at_least: float = 0.0) -> float:
        """Re-add a failed key after the backoff of its failures in a row (or ``at_least``, what a
        ``Retry-After`` asked); returns the delay."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
        wait = max(at_least, delay(failures, self.base_delay, self.max_delay))
        self.add_after(key, wait)
        return wait

    def forget(self, key: K) -> None:
        """``key`` was handled to its end: its failures and any look it asked for earlier are spent."""
        with self._cond:
            self._failures.pop(key, None)
            self._waiting.pop(key, None)

    def get(self, timeout: float | None = None) -> K | None:
        """The next key, or None on shutdown or timeout. Call :meth:`done` when finished with it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._promote_due()
                queue = self._high or self._low
                if queue:
                    key, _ = queue.popitem(last=False)
                    self._processing.add(key)
                    del self._dirty[key]
                    return key
                if self._shutdown:
                    return None
                now = time.monotonic()
                wait = None if deadline is None else deadline - now
                if wait is not None and wait <= 0:
                    return None
                if self._waiting:
                    until_due = self._delayed[0][0] - now
                    wait = until_due if wait is None else min(wait, until_due)
                self._cond.wait(None if wait is None else max(wait, 0.001))

    def _promote_due(self) -> None:
        now = time.monotonic()
        while self._delayed and (self._delayed[0][0] <= now or not self._waiting):
            due, _, key = heapq.heappop(self._delayed)
            if self._waiting.get(key) == due:
                del self._waiting[key]
                self._add(key, False)

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                (self._low if self._dirty[key] else self._high)[key] = None
                self._cond.notify()

    def __len__(self) -> int:
        with self._cond:
            return len(self._high) + len(self._low) + len(self._waiting)

    @property
    def depth(self) -> int:
        """Keys to be handled now: not those held back for a backoff or a later look."""
        with self._cond:
            self._promote_due()
            return len(self._high) + len(self._low)

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()
