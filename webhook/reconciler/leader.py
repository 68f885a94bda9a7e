"""Leader election through a ``coordination.k8s.io/v1`` Lease, as client-go's ``leaderelection``.

A candidate takes the Lease when it is free or its holder stopped renewing for ``lease_duration``,
renews it every ``retry_period``, and steps down (``is_leader`` false at once) when it could not renew
within ``renew_deadline``. Updates carry the Lease's ``resourceVersion``, so of two candidates racing
for an expired Lease exactly one wins (the other gets 409 Conflict). On stop the leader releases the
Lease so a standby takes over without waiting out the duration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(timezone.utc)


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
    ) -> None:
        if not lease_duration > renew_deadline > retry_period > 0:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")
        self.api = client.CoordinationV1Api(api)
        self.name, self.namespace, self.identity = name, namespace, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self.on_change = on_change
        self._leader = False
        self._last_renew = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        # Step down on our own clock too: a leader that cannot reach the API server must stop
        # writing before another replica can take the Lease over.
        return self._leader and time.monotonic() - self._last_renew < self.renew_deadline

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.retry_period + 5)
        if release and self._leader:
            self._release()
        self._set(False)

    def _set(self, leader: bool) -> None:
        if leader != self._leader:
            self._leader = leader
            log.info("leader election: %s %s", self.identity, "became leader" if leader else "is no longer leader")
            if self.on_change is not None:
                self.on_change(leader)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                held = self.try_acquire_or_renew()
            except Exception as exc:
                log.warning("leader election: %s", exc)
                held = False
            if held:
                self._last_renew = time.monotonic()
                self._set(True)
            elif not self.is_leader:
                self._set(False)
            self._stop.wait(self.retry_period)

    def _spec(self, transitions: int, acquire_time: datetime | None) -> client.V1LeaseSpec:
        now = _now()
        return client.V1LeaseSpec(
            holder_identity=self.identity,
            lease_duration_seconds=int(self.lease_duration),
            acquire_time=acquire_time or now,
            renew_time=now,
            lease_transitions=transitions,
        )

    def try_acquire_or_renew(self) -> bool:
        """One round of the election; True when we hold the Lease afterwards."""
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.retry_period * 2)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace), spec=self._spec(0, None))
            try:
                self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self.retry_period * 2)
                return True
            except ApiException as create_exc:
                if create_exc.status == 409:
                    return False
                raise
        spec = lease.spec or client.V1LeaseSpec()
        holder = spec.holder_identity or ""
        if holder and holder != self.identity:
            renewed = spec.renew_time or spec.acquire_time
            duration = spec.lease_duration_seconds or self.lease_duration
            if renewed is not None and (_now() - renewed).total_seconds() < duration:
                return False
        transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
        lease.spec = self._spec(transitions, spec.acquire_time if holder == self.identity else None)
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=self.retry_period * 2)
        except ApiException as exc:
            if exc.status == 409:  # someone else wrote first: they won this round
                return False
            raise
        return True

    def _release(self) -> None:
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=5)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.lease_duration_seconds = 1
                self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=5)
        except Exception as exc:
            log.warning("leader election: could not release the lease: %s", exc)
