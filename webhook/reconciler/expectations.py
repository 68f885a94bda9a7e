"""What a job's reconcile wrote and the cache has not shown yet, as client-go's ``ControllerExpectations``:
the job waits until its watch events bring each write (or :data:`TIMEOUT` passes), never acting on a cache
older than its own writes, and is not worked out again when they bring only that."""

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
_SENDING, _MET = object(), object()  # a request out, its answer not back; a write the cache has shown


class _Job:
    __slots__ = ("deadline", "foreign", "seen", "version", "wanted")

    def __init__(self, version: Any, deadline: float) -> None:
        self.version, self.deadline, self.foreign = version, deadline, False
        self.wanted: dict[Ident, Any] = {}  # each object written: the version answered, _SENDING or _MET
        self.seen: dict[Ident, set[Any]] = {}  # the versions its events brought while the request was out


class Expectations:
    """By job key, from a reconcile's start until the cache shows its writes: each object written, at
    the version answered (:data:`GONE`: deleted), and whether anything else of the job changed. The
    events seen while a request is out are kept to match its answer against (versions have no order)."""

    def __init__(self, timeout: float = TIMEOUT, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[Hashable, _Job] = {}
        self._swept = clock()

    def begin(self, job: Hashable, version: Any, cached: Callable[[Ident], Version | None]) -> bool | None:
        """At a reconcile's start (``cached``: an object's version in the cache, or :data:`GONE`): False
        while the last one's writes are not all in the cache; None when they are and nothing else of the
        job changed (nothing to do); True otherwise, noting the job's events from now on."""
        with self._lock:
            now = self.clock()
            held = self._jobs.get(job)
            if held is not None and now < held.deadline:
                if any(v is _SENDING or (v is not _MET and cached(i) != v) for i, v in held.wanted.items()):
                    return False
                if not held.foreign and held.version == version:
                    del self._jobs[job]
                    return None
            if now - self._swept > self.timeout:  # a job whose events were lost, and that nothing asked for again
                self._swept = now
                for over in [k for k, j in self._jobs.items() if j.deadline <= now]:
                    del self._jobs[over]
            self._jobs[job] = _Job(version, now + self.timeout)
            return True

    def sending(self, job: Hashable, idents: list[Ident]) -> None:
        """Requests about to go out for ``idents``: what the watch brings of them meanwhile is kept."""
        with self._lock:
            held = self._jobs.setdefault(job, _Job(None, self.clock() + self.timeout))
            for ident in idents:
                held.wanted[ident], held.seen[ident] = _SENDING, set()

    def sent(self, job: Hashable, written: dict[Ident, Version | None]) -> None:
        """The reconcile's end: each object of ``written`` at its version (or :data:`GONE`); an object
        sent but not in it (failed, or left alone) is expected no more, and the job is worked out again."""
        with self._lock:
            held = self._jobs.get(job)
            if held is None:
                return
            for ident in [i for i, v in held.wanted.items() if v is _SENDING]:
                seen = held.seen.pop(ident)
                held.foreign |= ident not in written or bool(seen - {written[ident]})
                if ident not in written:
                    del held.wanted[ident]
                else:
                    held.wanted[ident] = _MET if written[ident] in seen else written[ident]
            if not held.wanted:
                del self._jobs[job]  # nothing written: nothing to wait for, nor to skip

    def observe(self, job: Hashable, ident: Ident, version: Version | None) -> None:
        """A watch event: ``ident`` of ``job`` is now at ``version`` (:data:`GONE`: deleted)."""
        if job not in self._jobs:
            return  # the usual event takes no lock
        with self._lock:
            held = self._jobs.get(job)
            if held is None:
                return
            wanted = held.wanted.get(ident, _MET)
            if wanted is _SENDING:
                held.seen[ident].add(version)
            elif wanted is not _MET and wanted == version:
                held.wanted[ident] = _MET
            else:
                held.foreign = True  # another change of the job's objects than its own writes
