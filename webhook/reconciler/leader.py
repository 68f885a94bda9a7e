"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection``, timed on this
process's monotonic clock, never the Lease's times: a leader that cannot renew within ``renew_deadline``
stops before another candidate can take over. Not the client's ``kubernetes.leaderelection``: it leads
once, cannot be stopped (nor release the Lease on SIGTERM) and measures on the wall clock.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.rest import Rest

from .owned import LEASE

log = logging.getLogger(__name__)


def _now() -> str:
    """The time as a Lease's ``MicroTime`` is written (RFC 3339, microseconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, api: client.ApiClient, name: str, namespace: str, identity: str, *, lease_duration: float = 15.0,
                 renew_deadline: float = 10.0, retry_period: float = 2.0, on_change: Callable[[bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.on_change = on_change
        self.clock = clock
        self.rest = Rest(api, timeout=min(retry_period * 2, renew_deadline / 2))
        self._leader = False
        self._renewed_at = -math.inf
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = -math.inf
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        # On our clock, whether or not the loop noticed: a leader stops before another can take over.
        return self._leader and self.clock() - self._renewed_at < self.renew_deadline

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            # A round in flight ends with nothing done (the loop checks the stop flag); a renewal it
            # still lands before the release below is released with it, one after it gets 409.
            self._thread.join(1.0)
        leading = self.is_leader
        self._set(False)
        if release and leading:
            self._release()

    def _set(self, leader: bool) -> None:
        if leader != self._leader:
            self._leader = leader
            log.info("leader election: %s %s", self.identity, "became leader" if leader else "is no longer leader")
            if self.on_change is not None:
                self.on_change(leader)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = self.clock()
            try:
                held: bool | None = self.try_acquire_or_renew()
            except Exception as exc:
                log.warning("leader election: %s", exc)
                held = None
            if self._stop.is_set():
                return
            if held:
                self._renewed_at = started
                self._set(True)
            elif held is False or not self.is_leader:
                # Another candidate holds the Lease, or our renewals failed past the deadline.
                self._set(False)
            self._stop.wait(self.retry_period)

    def _observe(self, spec: dict[str, Any], at: float) -> None:
        record = (spec.get("holderIdentity") or "", spec.get("leaseDurationSeconds"), spec.get("acquireTime"), spec.get("renewTime"),
                  spec.get("leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, at

    def _spec(self, transitions: int, acquire_time: str | None) -> dict[str, Any]:
        now = _now()
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": math.ceil(self.lease_duration),
            "acquireTime": acquire_time or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        """One round of the election: True when we hold the Lease afterwards, False when another
        candidate does; raises when the API server could not be asked."""
        now = self.clock()
        lease = self.rest.get(LEASE, self.namespace, self.name)
        if lease is None:
            lease = {"apiVersion": LEASE.api_version, "kind": LEASE.kind,
                     "metadata": {"name": self.name, "namespace": self.namespace}, "spec": self._spec(0, None)}
            write = functools.partial(self.rest.create, LEASE, self.namespace, lease)
        else:
            spec = lease.get("spec") or {}
            self._observe(spec, now)
            holder = spec.get("holderIdentity") or ""
            if holder and holder != self.identity:
                duration = spec.get("leaseDurationSeconds") or math.ceil(self.lease_duration)
                if now < self._observed_at + duration:
                    return False
            transitions = (spec.get("leaseTransitions") or 0) + (0 if holder == self.identity else 1)
            # The Lease as read, resourceVersion included: of two writers of the same version one gets 409.
            lease["spec"] = self._spec(transitions, spec.get("acquireTime") if holder == self.identity else None)
            write = functools.partial(self.rest.replace, LEASE, lease)
        try:
            write()
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote first: they won this round
                return False
            raise
        self._observe(lease["spec"], now)
        return True

    def _release(self) -> None:
        rest = Rest(self.rest.api, timeout=1)
        try:
            lease = rest.get(LEASE, self.namespace, self.name)
            spec = (lease or {}).get("spec") or {}
            if lease is not None and spec.get("holderIdentity") == self.identity:
                lease["spec"] = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _now()}
                rest.replace(LEASE, lease)
        except Exception as exc:
            log.warning("leader election: could not release the lease: %s", exc)
