"""The ClusterRole and Role grant exactly the API calls the webhook and the reconciler make.

The calls are not listed by hand: the code runs every path that talks to the API server (job cache
and live GET, reconciles of every kind, scaling, plugin removal, job deletion, an unmanaged object,
an invalid job, leader election) against the API-server double, which records each request's verb
and resource; a new call without its permission fails here.
"""

from __future__ import annotations

import asyncio
import copy
import time

import yaml
from kubernetes import client

from volcano_job_webhook.plugins import Chain
from tests.apiserver import FakeApiServer
from tests.conftest import EXAMPLES
from tests.manifests_util import rbac_permissions
from volcano_job_webhook.server.jobs.kube import KubeJobSource
from volcano_job_webhook.reconciler.leader import LeaderElector
from volcano_job_webhook.reconciler import Reconciler


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_granted_permissions_are_exactly_the_calls_made():
    with FakeApiServer() as server:
        core = client.CoreV1Api(server.api_client())

        # The test changes jobs straight in the double's store, so that only the product's own
        # requests are recorded.
        def create(name: str, mutate=lambda job: None) -> None:
            job = yaml.safe_load((EXAMPLES / "jobs" / f"{name}-job.yaml").read_text())
            job["metadata"].pop("uid")
            mutate(job)
            server.put_object(job)

        core.create_namespaced_config_map("default", {"metadata": {"name": "svc-demo-svc"}, "data": {}})
        server.clear_requests()  # from here on, only the product's calls

        elector = LeaderElector(server.api_client(), "rec", "volcano-job-webhook", "me",
                                lease_duration=1.5, renew_deadline=1.0, retry_period=0.2)
        elector.start()
        wait_for(lambda: elector.is_leader)
        reconciler = Reconciler(server.api_client(), Chain(), resync_seconds=0.2, is_leader=lambda: elector.is_leader)
        reconciler.start()
        source = KubeJobSource(server.api_client())
        source.start()
        try:
            create("mpi")
            create("ray")
            create("svc")
            create("env", lambda job: job["spec"]["plugins"].update({"nope": []}))
            wait_for(lambda: len(server.objects("secrets")) == 1 and len(server.objects("services")) == 4)
            job = copy.deepcopy(server.get_object("jobs", "mpi-demo", "default"))
            job["spec"]["tasks"][1]["replicas"] = 3
            server.put_object(job)
            wait_for(lambda: any(cm["data"].get("VC_MPIWORKER_NUM") == "3" for cm in server.objects("configmaps")))
            server.delete_object("jobs", "ray-demo", "default")
            wait_for(lambda: len(server.objects("services")) == 2)
            # Drift in a Service and a NetworkPolicy is repaired (update).
            svc = copy.deepcopy(server.get_object("services", "svc-demo", "default"))
            svc["spec"]["publishNotReadyAddresses"] = False
            server.put_object(svc)
            policy = copy.deepcopy(server.get_object("networkpolicies.networking.k8s.io", "mpi-demo", "default"))
            policy["spec"]["ingress"] = []
            server.put_object(policy)
            wait_for(lambda: server.get_object("services", "svc-demo", "default")["spec"]["publishNotReadyAddresses"] is True)
            wait_for(lambda: server.get_object("networkpolicies.networking.k8s.io", "mpi-demo", "default")["spec"]["ingress"])
            server.delete_object("jobs", "mpi-demo", "default")
            wait_for(lambda: not server.objects("secrets"))
            wait_for(lambda: server.objects("events"))
            # The webhook's live GET on a cache miss.
            source.informer.stop()
            create("tensorflow")
            assert asyncio.run(source.get("default", "tf-demo")) is not None
        finally:
            source.stop()
            reconciler.stop()
            elector.stop()
        used = server.permissions_used()
    reasons = {e["reason"] for e in server.objects("events")}
    assert {"InvalidPlugins", "ResourceNotManaged"} <= reasons
    granted = rbac_permissions()
    assert used - granted == set(), "calls the ClusterRole/Role does not grant"
    assert granted - used == set(), "permissions granted that the code never uses"
