"""Leader election against a real API server: time is this process's own clock, never the holder's.

Another holder is played by the test writing the Lease as the admin, with ``renewTime`` as a
holder whose clock is far off would write it. The elector's clock is a :class:`FakeClock` the test
moves, so each test asserts what the elector does just before and just after an instant that
matters (a lease duration, a renew deadline) rather than how long something took.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from tests.helpers.clock import FakeClock
from tests.helpers.envtest import (
    NOBODY,
    EnvTest,
    create,
    delete,
    grant_role,
    new_namespace,
    read,
    replace,
    wait_until,
)
from volcano_job_webhook.reconciler.leader import LeaderElector

LEASE = "coordination.k8s.io/v1"


def stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def hold(admin: Any, namespace: str, name: str, holder: str, renewed: datetime, duration: int) -> None:
    """Write the Lease as ``holder`` would, renewed at ``renewed`` by its clock."""
    spec = {"holderIdentity": holder, "leaseDurationSeconds": duration, "acquireTime": stamp(renewed),
            "renewTime": stamp(renewed), "leaseTransitions": 0}
    current = read(admin, LEASE, "Lease", name, namespace)
    if current is None:
        create(admin, {"apiVersion": LEASE, "kind": "Lease", "metadata": {"name": name, "namespace": namespace}, "spec": spec})
    else:
        replace(admin, {**current, "apiVersion": LEASE, "kind": "Lease", "spec": spec})


class LeaseReads:
    """Counts an elector's finished reads of its Lease, and those refused (403), so a test can wait
    until the elector has acted on what was just written."""

    def __init__(self, elector: LeaderElector) -> None:
        self.finished = self.refused = 0
        read = elector.rest.get

        def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                return read(*args, **kwargs)
            except ApiException as exc:
                self.refused += exc.status == 403
                raise
            finally:
                self.finished += 1

        elector.rest.get = counted  # type: ignore[method-assign]

    def acted(self) -> None:
        """Return once a whole round of the election began after this call: the read after the next
        one started after it, and the round it began is over when the one after that finishes."""
        target = self.finished + 3
        wait_until(lambda: self.finished >= target, 10, "three more reads of the Lease")


@pytest.fixture
def elector(envtest: EnvTest, kube_admin: Any) -> Iterator[tuple[LeaderElector, str, FakeClock]]:
    namespace = new_namespace(kube_admin)
    clock = FakeClock()
    candidate = LeaderElector(envtest.api_client(), "rec", namespace, "me", lease_duration=2, renew_deadline=1.5, retry_period=0.2,
                              clock=clock)
    yield candidate, namespace, clock
    candidate.stop(release=False)


def test_a_holder_whose_clock_is_behind_keeps_its_lease_while_it_renews(elector: tuple[LeaderElector, str, FakeClock], kube_admin: Any) -> None:
    candidate, namespace, clock = elector
    reads = LeaseReads(candidate)
    behind = datetime.now(UTC) - timedelta(hours=1)
    hold(kube_admin, namespace, "rec", "other", behind, duration=2)
    candidate.start()
    reads.acted()
    for _ in range(5):  # 7.5 s in all on the candidate's clock, each renewal within the 2 s
        clock.advance(1.5)
        reads.acted()
        assert not candidate.is_leader, "took a Lease its holder keeps renewing (its renewTime looks an hour old here)"
        behind += timedelta(seconds=1.5)
        hold(kube_admin, namespace, "rec", "other", behind, duration=2)
        reads.acted()
    # Renewals stop: the Lease lasts its duration from when the candidate saw the last one.
    clock.advance(1.9)
    reads.acted()
    assert not candidate.is_leader, "not before the duration has passed since the candidate saw the last renewal"
    clock.advance(0.2)
    wait_until(lambda: candidate.is_leader, 10, "the candidate to take the Lease once renewals stop")


def test_a_dead_holder_whose_clock_was_ahead_is_taken_over_after_the_duration(elector: tuple[LeaderElector, str, FakeClock],
                                                                             kube_admin: Any) -> None:
    candidate, namespace, clock = elector
    reads = LeaseReads(candidate)
    hold(kube_admin, namespace, "rec", "other", datetime.now(UTC) + timedelta(hours=1), duration=2)
    candidate.start()
    reads.acted()
    clock.advance(1.9)
    reads.acted()
    assert not candidate.is_leader, "not before the duration has passed since the candidate first saw the Lease"
    clock.advance(0.2)
    wait_until(lambda: candidate.is_leader, 10, "the Lease taken over (its renewTime looks an hour ahead here)")
    lease = read(kube_admin, LEASE, "Lease", "rec", namespace)
    assert lease is not None and lease["spec"]["holderIdentity"] == "me" and lease["spec"]["leaseTransitions"] == 1


def test_a_leader_whose_renewals_fail_stops_leading_by_the_renew_deadline(envtest: EnvTest, kube_admin: Any) -> None:
    namespace = new_namespace(kube_admin)
    grant_role(kube_admin, NOBODY, namespace, "lease",
               [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}])
    changes: list[bool] = []
    clock = FakeClock()
    leader = LeaderElector(envtest.api_client(NOBODY), "rec", namespace, "me", lease_duration=3, renew_deadline=2,
                           retry_period=0.2, on_change=changes.append, clock=clock)
    reads = LeaseReads(leader)
    leader.start()
    try:
        wait_until(lambda: leader.is_leader, 10, "leadership")
        delete(kube_admin, "rbac.authorization.k8s.io/v1", "RoleBinding", "lease", namespace)
        # Until the authorizer's cache drops the binding renewals may still pass; on the leader's
        # clock, standing still, they all pass at the instant its deadline counts from.
        wait_until(lambda: reads.refused, 10, "a renewal refused")
        clock.advance(1.9)
        reads.acted()
        assert leader.is_leader, "refused renewals end nothing before the renew deadline"
        clock.advance(0.1)
        assert not leader.is_leader, "not leading from the renew deadline on, on its own clock, before its loop comes round"
        wait_until(lambda: changes == [True, False], 5, "on_change(False), once")
        reads.acted()
        assert not leader.is_leader
        lease = read(kube_admin, LEASE, "Lease", "rec", namespace)
        assert lease is not None and lease["spec"]["holderIdentity"] == "me", "nobody else took it: stepping down was our own doing"
    finally:
        leader.stop(release=False)
