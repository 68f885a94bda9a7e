"""Leader election against a real API server: time is this process's own clock, never the holder's.

Another holder is played by the test writing the Lease as the admin, with ``renewTime`` as a
holder whose clock is far off would write it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.envtest import (
    NOBODY,
    EnvTest,
    create,
    delete,
    new_namespace,
    read,
    replace,
    wait_for_bindings,
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


@pytest.fixture
def elector(envtest: EnvTest, kube_admin: Any) -> Iterator[tuple[LeaderElector, str]]:
    namespace = new_namespace(kube_admin)
    candidate = LeaderElector(envtest.api_client(), "rec", namespace, "me", lease_duration=2, renew_deadline=1.5, retry_period=0.2)
    yield candidate, namespace
    candidate.stop(release=False)


def test_a_holder_whose_clock_is_behind_keeps_its_lease_while_it_renews(elector: tuple[LeaderElector, str], kube_admin: Any) -> None:
    candidate, namespace = elector
    behind = datetime.now(UTC) - timedelta(hours=1)
    hold(kube_admin, namespace, "rec", "other", behind, duration=2)
    candidate.start()
    renewing_until = time.monotonic() + 5
    while time.monotonic() < renewing_until:
        time.sleep(0.4)
        behind += timedelta(seconds=0.4)
        hold(kube_admin, namespace, "rec", "other", behind, duration=2)
        assert not candidate.is_leader, "took a Lease its holder keeps renewing (its renewTime looks an hour old here)"
    stopped = time.monotonic()
    wait_until(lambda: candidate.is_leader, 10, "the candidate to take the Lease once renewals stop")
    # Not before the duration has passed since the candidate saw the last renewal.
    assert time.monotonic() - stopped >= 1.5


def test_a_dead_holder_whose_clock_was_ahead_is_taken_over_after_the_duration(elector: tuple[LeaderElector, str], kube_admin: Any) -> None:
    candidate, namespace = elector
    hold(kube_admin, namespace, "rec", "other", datetime.now(UTC) + timedelta(hours=1), duration=2)
    seen = time.monotonic()
    candidate.start()
    wait_until(lambda: candidate.is_leader, 10, "the Lease taken over (its renewTime looks an hour ahead here)")
    assert time.monotonic() - seen >= 1.8
    lease = read(kube_admin, LEASE, "Lease", "rec", namespace)
    assert lease is not None and lease["spec"]["holderIdentity"] == "me" and lease["spec"]["leaseTransitions"] == 1


def test_a_leader_whose_renewals_fail_stops_leading_by_the_renew_deadline(envtest: EnvTest, kube_admin: Any) -> None:
    namespace = new_namespace(kube_admin)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "lease", "namespace": namespace},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "lease", "namespace": namespace},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lease"},
               "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": NOBODY}]}
    create(kube_admin, role)
    create(kube_admin, binding)
    wait_for_bindings(kube_admin, [role, binding])
    changes: list[tuple[bool, float]] = []
    lock = threading.Lock()

    def on_change(leading: bool) -> None:
        with lock:
            changes.append((leading, time.monotonic()))

    leader = LeaderElector(envtest.api_client(NOBODY), "rec", namespace, "me", lease_duration=3, renew_deadline=2,
                           retry_period=0.2, on_change=on_change)
    leader.start()
    try:
        wait_until(lambda: leader.is_leader, 10, "leadership")
        delete(kube_admin, "rbac.authorization.k8s.io/v1", "RoleBinding", "lease", namespace)
        revoked = time.monotonic()
        # Until the authorizer's cache drops the binding renewals may still pass: by then, and the
        # renew deadline after the last renewal that passed, the leader has stepped down.
        wait_until(lambda: not leader.is_leader, 10, "stepping down once renewals fail")
        stepped_down = time.monotonic()
        wait_until(lambda: changes and changes[-1][0] is False, 5, "on_change(False)")
        assert changes[-1][1] - stepped_down < 1.0, "told on the elector's own clock, not at some later round"
        time.sleep(1.0)
        assert not leader.is_leader
        lease = read(kube_admin, LEASE, "Lease", "rec", namespace)
        assert lease is not None and lease["spec"]["holderIdentity"] == "me", "nobody else took it: stepping down was our own doing"
        assert stepped_down - revoked < 2 + 5, "within the renew deadline of the last renewal the authorizer let through"
    finally:
        leader.stop(release=False)
