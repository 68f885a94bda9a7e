"""What a workload's reconcile wrote and its caches have not shown yet, as client-go's ``ControllerExpectations``:
they gate a reconcile — the next one waits until the caches hold its own last writes, so it never
acts on a cache older than them — and never replace one. Each object a reconcile writes goes through:

| state        | entered by                                  | left by                                             |
|--------------|---------------------------------------------|-----------------------------------------------------|
| sending      | :meth:`~Expectations.sending`, request out  | :meth:`~Expectations.sent`: expecting the answer's  |
|              | (the versions its events bring are kept)    | version; dropped when it failed, was left alone, or |
|              |                                             | its event came while the request was out            |
| expecting v  | :meth:`~Expectations.sent`, answered at v   | an event at v, or the cache at v (met); the         |
|              | (:data:`GONE`: deleted; a delete a          | workload's deadline, :data:`TIMEOUT` after its last |
|              | finalizer holds: its terminating version)   | sending (expired)                                   |

A workload with no object sending or expecting has no entry. :meth:`~Expectations.pending` answers how long
a workload still waits: the reconcile returns that as its requeue, and the awaited events queue it sooner.
Versions are compared for equality only, as the API's contract says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from volcano_job_webhook.kube.records import Version

# Far longer than a watch takes to bring an event: only one a lost watch missed is waited out.
TIMEOUT = 30.0
Ident = tuple[str, str]  # (kind, name)
GONE = None  # the version of a deleted object
_SENDING = object()


class _Workload:
    __slots__ = ("deadline", "seen", "wanted")

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.wanted: dict[Ident, Any] = {}  # each object written: _SENDING, or the version answered
        self.seen: dict[Ident, set[Any]] = {}  # the versions its events brought while the request was out


class Expectations:
    """By workload key, the objects its last reconcile wrote and the caches have yet to show (see the table)."""

    def __init__(self, timeout: float = TIMEOUT, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.clock = clock
        self._lock = threading.Lock()
        self._workloads: dict[Hashable, _Workload] = {}

    def __len__(self) -> int:
        """Jobs with an object still expected."""
        return len(self._workloads)

    def pending(self, workload: Hashable, cached: Callable[[Ident], Version | None]) -> float:
        """Seconds ``workload`` still waits for its writes (0: none, or its deadline passed); ``cached`` gives
        an object's version in the cache, or :data:`GONE`. What the cache already shows is met."""
        with self._lock:
            held = self._workloads.get(workload)
            if held is None:
                return 0.0
            left = held.deadline - self.clock()
            for ident in [i for i, v in held.wanted.items() if v is not _SENDING and cached(i) == v]:
                del held.wanted[ident]
            if left > 0 and held.wanted:
                return left
            del self._workloads[workload]  # met, or expired: a lost event is waited out no longer
            return 0.0

    def sending(self, workload: Hashable, idents: list[Ident]) -> None:
        """Requests about to go out for ``idents``: what the watch brings of them meanwhile is kept."""
        if not idents:
            return
        with self._lock:
            held = self._workloads.setdefault(workload, _Workload(0.0))
            held.deadline = self.clock() + self.timeout
            for ident in idents:
                held.wanted[ident], held.seen[ident] = _SENDING, set()

    def sent(self, workload: Hashable, written: dict[Ident, Version | None]) -> None:
        """The requests are back: each object of ``written`` at its version (or :data:`GONE`); one sent but
        not in it (failed, or left alone) is expected no more."""
        with self._lock:
            held = self._workloads.get(workload)
            if held is None:
                return
            for ident in [i for i, v in held.wanted.items() if v is _SENDING]:
                seen = held.seen.pop(ident)
                if ident in written and written[ident] not in seen:
                    held.wanted[ident] = written[ident]
                else:
                    del held.wanted[ident]
            if not held.wanted:
                del self._workloads[workload]

    def observe(self, workload: Hashable, ident: Ident, version: Version | None) -> None:
        """A watch event: ``ident`` of ``workload`` is now at ``version`` (:data:`GONE`: deleted)."""
        if workload not in self._workloads:
            return  # the usual event takes no lock
        with self._lock:
            held = self._workloads.get(workload)
            if held is None or ident not in held.wanted:
                return
            wanted = held.wanted[ident]
            if wanted is _SENDING:
                held.seen[ident].add(version)
            elif wanted == version:
                del held.wanted[ident]
                if not held.wanted:
                    del self._workloads[workload]
