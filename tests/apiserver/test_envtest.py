"""The envtest harness itself (tests/helpers/envtest.py): users get what RBAC grants them and nothing else,
kubeconfigs work with the official loader, new namespaces take Pods, the audit log records
refusals, and the OwnerReferencesPermissionEnforcement mode enforces.

Also what the two modes mean for this project's manifests: the reconciler's side objects carry a
``blockOwnerDeletion`` owner reference to their Job, which a hardened API server only accepts from
someone who may update ``jobs/finalizers``.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes.client.rest import ApiException

from tests.helpers.envtest import (
    JOB_API_VERSION,
    NOBODY,
    OWNER_REFERENCES_ENFORCEMENT,
    WEBHOOK_USER,
    ApiServerFactory,
    EnvTest,
    create,
    grant_role,
    new_namespace,
    request,
    resource_path,
    status_message,
    wait_until,
)
from tests.helpers.jobs import example_job, job_owner
from volcano_job_webhook.plugins import Chain, Job

MODES = {"default": (), "owner-references-enforced": (OWNER_REFERENCES_ENFORCEMENT,)}


def status_of(call: Any) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def test_token_users_have_exactly_their_bindings(envtest: EnvTest) -> None:
    jobs = resource_path(envtest.api_client(), JOB_API_VERSION, "Job", "default")
    webhook, nobody = envtest.api_client(WEBHOOK_USER), envtest.api_client(NOBODY)
    assert status_of(lambda: request(webhook, "GET", jobs)) == 200  # the manifests' ClusterRole
    assert status_of(lambda: request(webhook, "GET", "/api/v1/namespaces/default/pods")) == 403  # not granted
    assert status_of(lambda: request(nobody, "GET", jobs)) == 403
    assert status_of(lambda: request(envtest.api_client(), "GET", "/api/v1/namespaces/default/pods")) == 200


def test_kubeconfig_works_with_the_official_loader(envtest: EnvTest) -> None:
    api = kube_config.new_client_from_config(config_file=str(envtest.kubeconfig(WEBHOOK_USER)))
    try:
        listed: Any = kube_client.CustomObjectsApi(api).list_cluster_custom_object("batch.volcano.sh", "v1alpha1", "jobs")
        assert listed["kind"] == "JobList"
        review = request(api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                         body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review["status"]["userInfo"]["username"] == WEBHOOK_USER
        assert review["status"]["userInfo"]["groups"] == ["system:authenticated"]  # no group of its own
    finally:
        api.close()


def test_a_new_namespace_takes_pods(kube_admin: kube_client.ApiClient, kube_namespace: str) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": kube_namespace},
           "spec": {"containers": [{"name": "c", "image": "busybox:1.36.1"}]}}
    stored = create(kube_admin, pod)
    assert stored["spec"]["serviceAccountName"] == "default"
    assert stored["status"]["phase"] == "Pending"  # no scheduler, no kubelet


def test_the_audit_log_records_refusals(envtest: EnvTest) -> None:
    nobody = envtest.api_client(NOBODY)
    path = resource_path(nobody, "v1", "Secret", "default", "audit-probe")
    assert status_of(lambda: request(nobody, "GET", path)) == 403
    refused = wait_until(
        lambda: [e for e in envtest.audit_events(NOBODY) if e.name == "audit-probe"], 10, "the refusal in the audit log"
    )
    assert [(e.permission, e.namespace, e.code) for e in refused] == [(("", "secrets", "get"), "default", 403)]


@pytest.mark.parametrize("mode", MODES)
def test_owner_reference_enforcement_is_a_mode(mode: str, apiserver_factory: ApiServerFactory) -> None:
    """A user who may create ConfigMaps but not update ``jobs/finalizers`` can set
    ``blockOwnerDeletion`` on a Job owner reference only where the plugin is off."""
    server = apiserver_factory(MODES[mode])
    admin = server.api_client()
    namespace = new_namespace(admin)
    job = create(admin, example_job("env", namespace))
    grant_role(admin, NOBODY, namespace, "configmaps", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}])
    owner = job_owner(job)
    configmap = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "owned", "namespace": namespace, "ownerReferences": [owner]}}
    nobody = server.api_client(NOBODY)
    if mode == "default":
        assert create(nobody, configmap)["metadata"]["ownerReferences"] == [owner]
    else:
        with pytest.raises(ApiException) as info:
            create(nobody, configmap)
        assert info.value.status == 403
        assert "cannot set blockOwnerDeletion" in status_message(info.value)


# With OwnerReferencesPermissionEnforcement (OpenShift, hardened clusters) the blockOwnerDeletion
# owner reference every side object carries needs update on batch.volcano.sh jobs/finalizers, which
# the chart's ClusterRole grants (charts/volcano-job-webhook/templates/rbac.yaml; docs/install.md says why).
@pytest.mark.parametrize("mode", ["default", "owner-references-enforced"])
def test_the_side_objects_are_allowed_by_the_manifests_rbac(mode: str, apiserver_factory: ApiServerFactory) -> None:
    """The reconciler's writes, made directly: every side object of the mpi example (Secret,
    ConfigMap, Service, NetworkPolicy) created as the manifests' ServiceAccount."""
    server = apiserver_factory(MODES[mode])
    admin = server.api_client()
    namespace = new_namespace(admin)
    job = Job.from_object(create(admin, example_job("mpi", namespace)))
    webhook = server.api_client(WEBHOOK_USER)
    objects = Chain().resources(job)
    assert {o["kind"] for o in objects} == {"Secret", "ConfigMap", "Service", "NetworkPolicy"}
    refused = {}
    for obj in objects:
        try:
            create(webhook, obj)
        except ApiException as exc:
            refused[obj["kind"]] = status_message(exc)
    assert refused == {}
