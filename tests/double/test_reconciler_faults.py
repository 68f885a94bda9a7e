"""The reconciler under faults a real API server cannot be made to stage on cue — injected 429 and
5xx answers, dropped connections, watches cut, history expired (410 Gone), the server away and back —
against the in-process API double (tests/helpers/apiserver.py). Everything else is in tests/apiserver/test_reconciler.py
against a real kube-apiserver."""

from __future__ import annotations

import copy
import functools
import time

from kubernetes import client

from tests.helpers.apiserver import FakeApiServer
from tests.helpers.envtest import wait_until
from tests.helpers.jobs import example_job
from volcano_job_webhook.config import WebhookSettings
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB
from volcano_job_webhook.reconciler import Reconciler

MANAGED = {"configmaps": "ConfigMap", "services": "Service", "secrets": "Secret", "networkpolicies.networking.k8s.io": "NetworkPolicy"}


wait_for = functools.partial(wait_until, timeout=10.0, interval=0.05)


def create_job(server: FakeApiServer, name: str) -> dict:
    api = client.CustomObjectsApi(server.api_client())
    return api.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", example_job(name))


def state(server: FakeApiServer) -> dict[tuple[str, str], dict]:
    return {(kind, obj["metadata"]["name"]): obj for resource, kind in MANAGED.items() for obj in server.objects(resource)}


def comparable(objects: dict[tuple[str, str], dict]) -> dict[tuple[str, str], object]:
    """What two runs must agree on: data and spec (Secrets: which keys; a Service's clusterIP is allocated)."""
    out: dict[tuple[str, str], object] = {}
    for key, obj in objects.items():
        if key[0] == "Secret":
            out[key] = sorted(obj["data"])
        else:
            body = copy.deepcopy(obj.get("data", obj.get("spec")))
            if key[0] == "Service":
                body = {k: v for k, v in body.items() if k not in ("clusterIP", "clusterIPs")} | {"headless": body.get("clusterIP") == "None"}
            out[key] = body
    return out


def start(server: FakeApiServer) -> Reconciler:
    reconciler = Reconciler(server.api_client(), WebhookSettings(resync_seconds=3600, workloads=[]), Chain())
    reconciler.start()
    return reconciler


def test_faults_end_in_the_same_state_with_nothing_lost_or_duplicated(api_double: FakeApiServer) -> None:
    with FakeApiServer() as clean:
        r = start(clean)
        for name in ("mpi", "ray", "svc"):
            create_job(clean, name)
        wait_for(lambda: len(state(clean)) == 11, what="clean state")
        r.stop()
        expected = comparable(state(clean))

    # Faults aimed at the reconciler's own calls (the test creates jobs through the same server).
    api_double.fail_next(3, status=500, method="POST", path_contains="/configmaps")
    api_double.fail_next(2, status=429, method="POST", path_contains="/secrets", retry_after=0)
    api_double.fail_next(4, status=503, method="GET", path_contains="/configmaps")
    api_double.drop_next(1, method="POST", path_contains="/services")
    r = start(api_double)
    create_job(api_double, "mpi")
    wait_for(lambda: r.manager.ready, what="caches synced")
    api_double.close_watches()
    create_job(api_double, "ray")
    api_double.expire_history()
    api_double.close_watches()
    create_job(api_double, "svc")
    wait_for(lambda: len(state(api_double)) == 11, timeout=20, what="all objects despite faults")
    time.sleep(0.5)
    r.stop()
    assert comparable(state(api_double)) == expected
    creates = [q for q in api_double.requests if q.verb == "create" and q.status == 201 and q.resource not in ("jobs", "events")]
    assert len(creates) == 11, "each object created exactly once"
    lists = [q for q in api_double.requests if q.group == VOLCANO_JOB.group and q.resource == "jobs" and q.verb == "list"]
    assert len(lists) >= 2, "the expired watch was followed by a fresh list"


def test_a_reconcile_that_keeps_failing_is_retried_until_it_succeeds(api_double: FakeApiServer) -> None:
    # A reconcile does not retry: each failure sends the job back through the work queue's
    # rate-limited re-add, the one retry there is (no resync within the test).
    api_double.fail_next(6, status=500, method="POST", path_contains="/configmaps")
    r = start(api_double)
    try:
        create_job(api_double, "svc")
        wait_for(lambda: ("ConfigMap", "svc-demo-svc") in state(api_double), timeout=30, what="the ConfigMap, eventually")
        failed = [q for q in api_double.requests if q.verb == "create" and q.resource == "configmaps" and q.status == 500]
        assert len(failed) == 6
        assert r.metrics.reconciles.labels("error")._value.get() == 6
    finally:
        r.stop()


def test_the_api_server_away_and_back(api_double: FakeApiServer) -> None:
    r = start(api_double)
    try:
        create_job(api_double, "env")
        wait_for(lambda: r.manager.ready, what="caches synced")
        api_double.stop()
        time.sleep(0.5)
        api_double.restart()
        create_job(api_double, "svc")
        wait_for(lambda: len(state(api_double)) == 3, timeout=30, what="svc objects after the restart")
    finally:
        r.stop()
