"""The table of kinds (plugins/kinds.py): each kind's REST path and names, the lookups by resource,
by an owner reference's (group, kind) and by an object's (apiVersion, kind), and a controller
reference resolved through the table."""

from __future__ import annotations

import pytest

from volcano_job_webhook.plugins.kinds import (
    BATCH_JOB,
    CONFIG_MAP,
    JOBSET,
    KINDS,
    NETWORK_POLICY,
    VOLCANO_JOB,
    WORKLOADS,
    by_group_kind,
    by_resource,
    controller_of,
    kind_of,
)
from volcano_job_webhook.reconciler.owned import EVENT, OWNED


def test_each_kind_names_its_rest_path_as_the_api_server_serves_it():
    assert VOLCANO_JOB.path("ml", "train") == "/apis/batch.volcano.sh/v1alpha1/namespaces/ml/jobs/train"
    assert BATCH_JOB.path() == "/apis/batch/v1/jobs"
    assert JOBSET.path("ml") == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets"
    assert CONFIG_MAP.path("ml", "a") == "/api/v1/namespaces/ml/configmaps/a" and CONFIG_MAP.api_version == "v1"
    assert NETWORK_POLICY.api_version == "networking.k8s.io/v1" and EVENT.resource == "events"


def test_lookups_by_resource_and_by_group_and_kind():
    assert [by_resource(kind.resource) for kind in KINDS] == list(KINDS), "every resource names one kind"
    assert by_resource("jobs.batch") is BATCH_JOB and by_resource("jobsets.jobset.x-k8s.io") is JOBSET
    with pytest.raises(KeyError):
        by_resource("cronjobs.batch")
    assert by_group_kind("batch.volcano.sh", "Job") is VOLCANO_JOB and by_group_kind("batch", "Job") is BATCH_JOB
    assert by_group_kind("batch", "CronJob") is None and by_group_kind("apps", "Job") is None


def test_an_objects_kind_by_its_api_version_and_kind():
    assert kind_of({"apiVersion": "batch/v1", "kind": "Job"}) is BATCH_JOB
    assert kind_of({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job"}) is VOLCANO_JOB
    assert kind_of({"kind": "Job"}) is VOLCANO_JOB, "a job file may leave apiVersion out"
    assert kind_of({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet"}) is JOBSET
    assert kind_of({"apiVersion": "v1", "kind": "ConfigMap"}) is CONFIG_MAP
    assert kind_of({"kind": "JobSet"}) is None and kind_of({"apiVersion": "apps/v1", "kind": "Deployment"}) is None


def test_the_workloads_and_what_is_owned():
    assert WORKLOADS == (VOLCANO_JOB, JOBSET, BATCH_JOB), "a JobSet's Pods, which carry its Jobs' labels, match the JobSet first"
    assert list(OWNED) == ["ConfigMap", "Secret", "Service", "NetworkPolicy"]
    assert [kind.noun for kind in WORKLOADS] == ["job", "JobSet", "Job"]
    assert [kind.title for kind in WORKLOADS] == ["Volcano Job", "JobSet", "Indexed Job"], "what a list of several kinds calls each"


def test_the_controller_reference_resolved_through_the_table():
    def owned(*refs: dict[str, object]) -> dict[str, object]:
        return {"metadata": {"name": "x", "ownerReferences": list(refs)}}

    batch = {"apiVersion": "batch/v1", "kind": "Job", "name": "idx", "uid": "u1", "controller": True}
    found = controller_of(owned({"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u0"}, batch))
    assert found is not None and (found.kind, found.name, found.uid) == (BATCH_JOB, "idx", "u1"), "not the first: the controller"
    assert controller_of(owned({**batch, "controller": False})) is None
    assert controller_of(owned({**batch, "apiVersion": "example.com/v1"})) is None, "a kind not in the table"
    assert controller_of({"metadata": {"ownerReferences": "damaged"}}) is None and controller_of({}) is None
