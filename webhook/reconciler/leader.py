"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection``.

A candidate takes the Lease when it is free or its holder stopped renewing for ``lease_duration``,
renews it every ``retry_period``, and steps down (``is_leader`` false at once) when it could not renew
within ``renew_deadline``. Updates carry the Lease's ``resourceVersion``, so of two candidates racing
for an expired Lease exactly one wins (the other gets 409 Conflict). On stop the leader releases the
Lease so a standby takes over without waiting out the duration.

Time is only ever measured on this process's own monotonic clock, never compared with the times
written in the Lease (the holder's clock may be off by any amount):

* a holder's Lease expires ``leaseDurationSeconds`` after this process *observed* the record change
  (client-go's ``observedTime``), however old or new its ``renewTime`` looks here;
* a leader counts its renewal from the moment it *sent* it, and stops leading ``renew_deadline``
  later unless a renewal succeeded meanwhile. With ``renew_deadline < lease_duration``, it has
  stopped writing before any other candidate can have seen its Lease expire.

Why not the client's ``kubernetes.leaderelection`` (with its ``LeaseLock``): its ``run()`` leads once
and returns (a replica that lost the Lease cannot stand by for it again without a new elector); it
cannot be stopped (its loops sleep, and ``acquire`` never returns while another holds the Lease), so
it can neither release the Lease on SIGTERM nor let the process stop within two seconds; it measures
on the wall clock; and it has no "am I leading now" that the writers can ask before each attempt.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _record(spec: client.V1LeaseSpec) -> tuple[Any, ...]:
    return (spec.holder_identity or "", spec.lease_duration_seconds, spec.acquire_time, spec.renew_time,
            spec.lease_transitions)


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        name: str,
        namespace: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        self.api = client.CoordinationV1Api(api)
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.on_change = on_change
        self.clock = clock
        self.request_timeout = min(retry_period * 2, renew_deadline / 2)
        self._leader = False
        self._renewed_at = -math.inf
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = -math.inf
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        # On our own clock: a leader that cannot renew must stop writing before another replica can
        # take the Lease over, whether or not the loop has come round to notice.
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

    def _observe(self, spec: client.V1LeaseSpec, at: float) -> None:
        record = _record(spec)
        if record != self._observed:
            self._observed, self._observed_at = record, at

    def _spec(self, transitions: int, acquire_time: datetime | None) -> client.V1LeaseSpec:
        now = _now()
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=math.ceil(self.lease_duration),
            acquire_time=acquire_time or now,
            renew_time=now,
            lease_transitions=transitions,
        )

    def try_acquire_or_renew(self) -> bool:
        """One round of the election: True when we hold the Lease afterwards, False when another
        candidate does; raises when the API server could not be asked."""
        now = self.clock()
        timeout = self.request_timeout
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise
            spec = self._spec(0, None)
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace), spec=spec)
            try:
                self.api.create_namespaced_lease(self.namespace, body, _request_timeout=timeout)
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
            self._observe(spec, now)
            return True
        spec = lease.spec or client.V1LeaseSpec()
        self._observe(spec, now)
        holder = spec.holder_identity or ""
        if holder and holder != self.identity:
            duration = spec.lease_duration_seconds or math.ceil(self.lease_duration)
            if now < self._observed_at + duration:
                return False
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        lease.spec = self._spec(transitions, spec.acquire_time if holder == self.identity else None)
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=timeout)
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote first: they won this round
                return False
            raise
        self._observe(lease.spec, now)
        return True

    def _release(self) -> None:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=1)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = _now()
                self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=1)
        except Exception as exc:
            log.warning("leader election: could not release the lease: %s", exc)
