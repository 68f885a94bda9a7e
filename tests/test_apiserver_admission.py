"""Admission in the API-server double (tests/apiserver.py, tests/admission.py), driven through the
official ``kubernetes`` client against a tiny HTTPS webhook whose answers each test sets: which
requests reach which webhook, what the AdmissionReview holds, and what the client gets back for a
patch, a denial, a failed call, warnings; plus the double's validation, status subresource,
discovery and CRDs that the Volcano scenarios rely on."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.apiserver import FakeApiServer
from tests.envtest import create, delete, free_port, read, request, status_message
from tests.jobs import owner_reference, volcano_job
from tests.servers import Raw, Slow, TinyWebhook, denying, patching, tiny_webhook
from volcano_job_webhook.certs.issue import generate_ca

NS = "default"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyWebhook]:
    with tiny_webhook(tmp_path_factory.mktemp("tiny-webhook")) as hook:
        yield hook


@pytest.fixture
def webhook(tiny: TinyWebhook) -> TinyWebhook:
    tiny.answers.clear()
    tiny.reviews.clear()
    return tiny




def hook(name: str, url: str, ca_bundle: str, *, resources: tuple[str, ...] = ("pods",), operations: tuple[str, ...] = ("CREATE",),
         group: str = "", version: str = "v1", **extra: Any) -> dict[str, Any]:
    return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"url": url, "caBundle": ca_bundle},
            "rules": [{"operations": list(operations), "apiGroups": [group], "apiVersions": [version], "resources": list(resources)}],
            **extra}


def register(k8s: client.ApiClient, kind: str, *hooks: dict[str, Any], name: str = "test") -> None:
    body = {"metadata": {"name": name}, "webhooks": list(hooks)}
    admission = client.AdmissionregistrationV1Api(k8s)
    if kind == "mutating":
        admission.create_mutating_webhook_configuration(body)
    else:
        admission.create_validating_webhook_configuration(body)


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


def error_of(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.value.body)
    return body


# -- who is called ---------------------------------------------------------------


def test_a_mutating_webhook_patches_a_created_pod_and_sees_kube_apiservers_review(
        api_double: FakeApiServer, k8s: client.ApiClient, core: client.CoreV1Api, webhook: TinyWebhook) -> None:
    webhook.answers["/mutate"] = patching({"op": "add", "path": "/metadata/labels/wired", "value": "yes"})
    register(k8s, "mutating", hook("m.test", webhook.url + "/mutate", webhook.ca_bundle, timeoutSeconds=7))
    created = core.create_namespaced_pod(NS, pod("p", {"a": "b"}))
    assert created.metadata.labels == {"a": "b", "wired": "yes"}
    assert api_double.get_object("pods", "p", NS)["metadata"]["labels"]["wired"] == "yes"
    ((path, query, review),) = webhook.reviews
    assert (path, query) == ("/mutate", "timeout=7s")
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    request_ = review["request"]
    assert request_["uid"] and request_["operation"] == "CREATE" and request_["dryRun"] is False
    assert request_["kind"] == request_["requestKind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request_["resource"] == request_["requestResource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (request_["namespace"], request_["name"]) == (NS, "p")
    assert request_["object"]["metadata"]["labels"] == {"a": "b"} and request_["oldObject"] is None
    assert request_["options"]["kind"] == "CreateOptions" and request_["userInfo"]["username"]
    assert [(c.webhook, c.operation, c.resource, c.allowed, c.patched) for c in api_double.webhook_calls] == [
        ("m.test", "CREATE", "pods", True, True)]


def test_rules_choose_operations_resources_and_subresources(k8s: client.ApiClient, core: client.CoreV1Api,
                                                            webhook: TinyWebhook) -> None:
    url, ca = webhook.url, webhook.ca_bundle
    register(k8s, "validating",
             hook("create-pods", url + "/create-pods", ca),
             hook("update-any", url + "/update-any", ca, resources=("*",), operations=("UPDATE",)),
             hook("pod-status", url + "/pod-status", ca, resources=("pods/status",), operations=("*",)),
             hook("everything", url + "/everything", ca, resources=("*/*",), operations=("*",), group="*", version="*"),
             hook("cluster-only", url + "/cluster-only", ca,
                  rules=[{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": "Cluster"}]))
    core.create_namespaced_config_map(NS, {"metadata": {"name": "cm"}})
    assert webhook.paths() == ["/everything"]
    webhook.reviews.clear()
    core.create_namespaced_pod(NS, pod("p"))
    assert webhook.paths() == ["/create-pods", "/everything"]
    webhook.reviews.clear()
    core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"x": "y"}}})
    assert webhook.paths() == ["/update-any", "/everything"]
    webhook.reviews.clear()
    core.patch_namespaced_pod_status("p", NS, {"status": {"phase": "Running"}})
    assert webhook.paths() == ["/pod-status", "/everything"]
    assert webhook.reviews[0][2]["request"]["subResource"] == "status"
    webhook.reviews.clear()
    core.create_namespace({"metadata": {"name": "elsewhere"}})
    assert webhook.paths() == ["/everything", "/cluster-only"]


def test_object_selector_matches_new_or_old_labels(k8s: client.ApiClient, core: client.CoreV1Api, webhook: TinyWebhook) -> None:
    selector = {"matchExpressions": [{"key": "volcano.sh/job-name", "operator": "Exists"}]}
    register(k8s, "mutating", hook("m", webhook.url + "/m", webhook.ca_bundle, operations=("CREATE", "UPDATE"), objectSelector=selector))
    core.create_namespaced_pod(NS, pod("plain"))
    assert webhook.reviews == []
    core.create_namespaced_pod(NS, pod("of-a-job", {"volcano.sh/job-name": "j"}))
    assert len(webhook.reviews) == 1
    core.patch_namespaced_pod("of-a-job", NS, {"metadata": {"labels": {"volcano.sh/job-name": None}}})
    assert len(webhook.reviews) == 2  # the old object still had the label
    core.patch_namespaced_pod("of-a-job", NS, {"metadata": {"labels": {"other": "x"}}})
    assert len(webhook.reviews) == 2


def test_namespace_selector_sees_the_namespace_name_label(k8s: client.ApiClient, core: client.CoreV1Api, webhook: TinyWebhook) -> None:
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]},
                                     {"key": "team", "operator": "In", "values": ["a"]}]}
    register(k8s, "mutating", hook("m", webhook.url + "/m", webhook.ca_bundle, namespaceSelector=selector))
    core.create_namespace({"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    core.create_namespace({"metadata": {"name": "kube-system", "labels": {"team": "a"}}})
    core.create_namespace({"metadata": {"name": "team-b", "labels": {"team": "b"}}})
    for namespace in ("team-a", "kube-system", "team-b"):
        core.create_namespaced_pod(namespace, pod("p"))
    assert [review["request"]["namespace"] for _, _, review in webhook.reviews] == ["team-a"]


def test_mutating_then_validating_and_reinvocation_if_needed(api_double: FakeApiServer, k8s: client.ApiClient, core: client.CoreV1Api,
                                                              webhook: TinyWebhook) -> None:
    url, ca = webhook.url, webhook.ca_bundle
    webhook.answers["/first"] = patching({"op": "add", "path": "/metadata/annotations", "value": {"first": "1"}})
    webhook.answers["/second"] = patching({"op": "add", "path": "/metadata/labels/second", "value": "2"})
    seen: list[dict[str, Any]] = []
    webhook.answers["/check"] = lambda review: seen.append(review["request"]["object"]) or {"allowed": True}
    register(k8s, "mutating", hook("first", url + "/first", ca, reinvocationPolicy="IfNeeded"), name="a")
    register(k8s, "mutating", hook("second", url + "/second", ca), name="b")
    register(k8s, "validating", hook("check", url + "/check", ca))
    core.create_namespaced_pod(NS, pod("p"))
    # "first" again because "second" changed the object after it; the validating webhook last, on the result
    assert webhook.paths() == ["/first", "/second", "/first", "/check"]
    (final,) = seen
    assert final["metadata"]["labels"] == {"second": "2"} and final["metadata"]["annotations"] == {"first": "1"}
    assert final["metadata"]["uid"] and final["status"] == {"phase": "Pending"}


# -- what the client gets back ----------------------------------------------------------


def test_a_denial_is_the_webhooks_status_with_kube_apiservers_message(api_double: FakeApiServer, k8s: client.ApiClient,
                                                                      core: client.CoreV1Api, webhook: TinyWebhook) -> None:
    webhook.answers["/deny"] = denying("task 'x' is not in spec.tasks", code=403)
    register(k8s, "mutating", hook("pods.example.io", webhook.url + "/deny", webhook.ca_bundle))
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NS, pod("p"))
    assert info.value.status == 403
    body = error_of(info)
    assert body["message"] == "admission webhook \"pods.example.io\" denied the request: task 'x' is not in spec.tasks"
    assert body["status"] == "Failure"
    assert api_double.get_object("pods", "p", NS) is None
    webhook.answers["/deny"] = denying("no reason given")
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NS, pod("p"))
    assert info.value.status == 400  # under 400 (here none) is raised to 400, as ToStatusErr does


def test_a_validating_denial_stops_an_update_the_mutating_webhooks_allowed(api_double: FakeApiServer, k8s: client.ApiClient,
                                                                           core: client.CoreV1Api, webhook: TinyWebhook) -> None:
    core.create_namespaced_config_map(NS, {"metadata": {"name": "cm"}, "data": {"a": "1"}})
    webhook.answers["/v"] = lambda review: {"allowed": review["request"]["object"]["data"]["a"] == "1",
                                            "status": {"code": 422, "reason": "Invalid", "message": "a must stay 1"}}
    register(k8s, "validating", hook("v", webhook.url + "/v", webhook.ca_bundle, resources=("configmaps",), operations=("UPDATE",)))
    with pytest.raises(ApiException) as info:
        core.patch_namespaced_config_map("cm", NS, {"data": {"a": "2"}})
    assert info.value.status == 422 and error_of(info)["reason"] == "Invalid"
    assert status_message(info.value) == 'admission webhook "v" denied the request: a must stay 1'
    review = webhook.reviews[-1][2]["request"]
    assert review["oldObject"]["data"] == {"a": "1"} and review["object"]["data"] == {"a": "2"}
    assert api_double.get_object("configmaps", "cm", NS)["data"] == {"a": "1"}


def test_a_delete_is_admitted_with_the_old_object(api_double: FakeApiServer, k8s: client.ApiClient, core: client.CoreV1Api,
                                                  webhook: TinyWebhook) -> None:
    core.create_namespaced_config_map(NS, {"metadata": {"name": "keep"}})
    webhook.answers["/v"] = denying("kept")
    register(k8s, "validating", hook("v", webhook.url + "/v", webhook.ca_bundle, resources=("configmaps",), operations=("DELETE",)))
    with pytest.raises(ApiException) as info:
        core.delete_namespaced_config_map("keep", NS)
    assert info.value.status == 400
    review = webhook.reviews[-1][2]["request"]
    assert review["operation"] == "DELETE" and review["object"] is None and review["oldObject"]["metadata"]["name"] == "keep"
    assert review["options"]["kind"] == "DeleteOptions"
    assert api_double.get_object("configmaps", "keep", NS) is not None


def test_warnings_come_back_as_warning_headers(api_double: FakeApiServer, k8s: client.ApiClient, webhook: TinyWebhook) -> None:
    webhook.answers["/w"] = lambda review: {"allowed": True, "warnings": ['plugin "svc": left "out"', "second"]}
    register(k8s, "validating", hook("w", webhook.url + "/w", webhook.ca_bundle))
    warnings: list[str] = []
    request(k8s, "POST", f"/api/v1/namespaces/{NS}/pods", body=pod("p"), warnings=warnings)
    assert warnings == ['plugin "svc": left "out"', "second"]


@pytest.mark.parametrize(("answer", "timeout", "expected"), [
    (Raw(500, b"boom"), 10, 'an error on the server ("boom")'),
    (Raw(200, b"not json"), 10, "received invalid webhook response"),
    (lambda review: {"uid": "someone-else", "allowed": True}, 10, 'expected response.uid="'),
    (Slow(2.0, {"allowed": True}), 1, "context deadline exceeded"),
], ids=["http-500", "invalid-json", "wrong-uid", "timeout"])
def test_a_failed_call_fails_closed_or_is_ignored(api_double: FakeApiServer, k8s: client.ApiClient, core: client.CoreV1Api,
                                                  webhook: TinyWebhook, answer: Any, timeout: int, expected: str) -> None:
    webhook.answers["/f"] = answer if callable(answer) else (lambda review: answer)
    register(k8s, "mutating", hook("closed", webhook.url + "/f", webhook.ca_bundle, timeoutSeconds=timeout), name="closed")
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NS, pod("p"))
    assert info.value.status == 500 and error_of(info)["reason"] == "InternalError"
    message = status_message(info.value)
    assert message.startswith('Internal error occurred: failed calling webhook "closed": ') and expected in message
    assert api_double.get_object("pods", "p", NS) is None
    client.AdmissionregistrationV1Api(k8s).patch_mutating_webhook_configuration(
        "closed", [{"op": "add", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}])
    core.create_namespaced_pod(NS, pod("p"))
    assert api_double.get_object("pods", "p", NS) is not None


def test_an_unreachable_or_untrusted_webhook_fails_the_call(k8s: client.ApiClient, core: client.CoreV1Api, webhook: TinyWebhook) -> None:
    other_ca, _ = generate_ca("someone-else")
    port = free_port()
    register(k8s, "validating", hook("refused", f"https://127.0.0.1:{port}/v", webhook.ca_bundle), name="refused")
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NS, pod("p"))
    assert f"dial tcp 127.0.0.1:{port}: connect: connection refused" in status_message(info.value)
    client.AdmissionregistrationV1Api(k8s).delete_validating_webhook_configuration("refused")
    register(k8s, "validating", hook("untrusted", webhook.url + "/v", base64.b64encode(other_ca).decode()), name="untrusted")
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NS, pod("p"))
    assert "tls: failed to verify certificate: x509" in status_message(info.value)
    assert webhook.reviews == []
    client.AdmissionregistrationV1Api(k8s).delete_validating_webhook_configuration("untrusted")
    service = {"service": {"namespace": "volcano-job-webhook", "name": "volcano-job-webhook", "path": "/validate"}}
    register(k8s, "validating", {**hook("in-cluster", "", ""), "clientConfig": service}, name="in-cluster")
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NS, pod("p"))
    assert "cannot route to a Service" in status_message(info.value)


def test_dry_run_is_admitted_and_stores_nothing(api_double: FakeApiServer, k8s: client.ApiClient, webhook: TinyWebhook) -> None:
    webhook.answers["/m"] = patching({"op": "add", "path": "/metadata/labels", "value": {"wired": "yes"}})
    register(k8s, "mutating", hook("m", webhook.url + "/m", webhook.ca_bundle))
    would_be = create(k8s, {"apiVersion": "v1", "kind": "Pod", **pod("p"), "metadata": {"name": "p", "namespace": NS}}, dry_run=True)
    assert would_be["metadata"]["labels"] == {"wired": "yes"}
    assert webhook.reviews[-1][2]["request"]["dryRun"] is True
    assert api_double.get_object("pods", "p", NS) is None
    client.AdmissionregistrationV1Api(k8s).patch_mutating_webhook_configuration(
        "test", [{"op": "replace", "path": "/webhooks/0/sideEffects", "value": "Unknown"}])
    with pytest.raises(ApiException) as info:
        create(k8s, {"apiVersion": "v1", "kind": "Pod", **pod("p"), "metadata": {"name": "p", "namespace": NS}}, dry_run=True)
    assert info.value.status == 400 and status_message(info.value) == 'admission webhook "m" does not support dry run'


def test_webhook_configurations_themselves_are_never_admitted(k8s: client.ApiClient, webhook: TinyWebhook) -> None:
    webhook.answers["/deny"] = denying("no")
    register(k8s, "validating", hook("deny-all", webhook.url + "/deny", webhook.ca_bundle, resources=("*",), operations=("*",),
                                     group="*", version="*"))
    register(k8s, "mutating", hook("other", webhook.url + "/m", webhook.ca_bundle), name="other")
    client.AdmissionregistrationV1Api(k8s).delete_validating_webhook_configuration("test")
    assert webhook.reviews == []


# -- what the double validates and serves for the Volcano scenarios ----------------------------------


def test_two_controller_owner_references_are_invalid(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    one = {"metadata": {"name": "cm", "ownerReferences": [owner_reference("a", "1"), owner_reference("b", "2", controller=False)]}}
    core.create_namespaced_config_map(NS, one)
    with pytest.raises(ApiException) as info:
        core.patch_namespaced_config_map("cm", NS, {"metadata": {"ownerReferences": [owner_reference("a", "1"), owner_reference("b", "2")]}})
    assert info.value.status == 422
    body = error_of(info)
    assert body["reason"] == "Invalid" and body["details"]["causes"][0]["field"] == "metadata.ownerReferences"
    assert body["message"].startswith('ConfigMap "cm" is invalid: metadata.ownerReferences: Invalid value: [{"apiVersion":')
    assert body["message"].endswith('Only one reference can have Controller set to true. Found "true" in references for Job/a and Job/b')
    assert len(api_double.get_object("configmaps", "cm", NS)["metadata"]["ownerReferences"]) == 2


def test_a_pod_wired_twice_is_invalid(core: client.CoreV1Api) -> None:
    volume = {"name": "j-svc", "configMap": {"name": "j-svc"}}
    mount = {"name": "j-svc", "mountPath": "/etc/volcano"}
    doubled = pod("p", volumes=[volume, volume])
    doubled["spec"]["containers"][0]["volumeMounts"] = [mount, mount, {"name": "absent", "mountPath": "/x"}]
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod(NS, doubled)
    assert info.value.status == 422
    assert status_message(info.value) == (
        'Pod "p" is invalid: [spec.volumes[1].name: Duplicate value: "j-svc", '
        'spec.containers[0].volumeMounts[1].mountPath: Invalid value: "/etc/volcano": must be unique, '
        'spec.containers[0].volumeMounts[2].name: Not found: "absent"]')


def test_status_subresource_writes_only_status(api_double: FakeApiServer, core: client.CoreV1Api, k8s: client.ApiClient) -> None:
    created = core.create_namespaced_pod(NS, {**pod("p"), "status": {"phase": "Running"}})
    assert created.status.phase == "Pending"  # create starts a Pod Pending, whatever it was sent with
    core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Failed"}})
    assert api_double.get_object("pods", "p", NS)["status"] == {"phase": "Pending"}
    core.patch_namespaced_pod_status("p", NS, {"metadata": {"labels": {"a": "c"}}, "status": {"phase": "Succeeded"}})
    stored = api_double.get_object("pods", "p", NS)
    assert stored["status"] == {"phase": "Succeeded"} and stored["metadata"]["labels"] == {"a": "b"}
    custom = client.CustomObjectsApi(k8s)
    job = volcano_job("j", namespace=None, tasks=[{"name": "t", "replicas": 1}], status={"state": {"phase": "Running"}})
    assert "status" not in custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", job)
    custom.patch_namespaced_custom_object_status("batch.volcano.sh", "v1alpha1", NS, "jobs", "j", {"status": {"state": {"phase": "Pending"}}})
    assert api_double.get_object("jobs", "j", NS)["status"] == {"state": {"phase": "Pending"}}


def test_a_created_crd_is_served_and_discovered(api_double: FakeApiServer, k8s: client.ApiClient) -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "queues.example.io"},
           "spec": {"group": "example.io", "scope": "Cluster",
                    "names": {"kind": "Queue", "plural": "queues", "singular": "queue", "listKind": "QueueList"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {"type": "object"}}}]}}
    stored = create(k8s, crd)
    assert {c["type"] for c in stored["status"]["conditions"]} == {"Established", "NamesAccepted"}
    created = create(k8s, {"apiVersion": "example.io/v1", "kind": "Queue", "metadata": {"name": "default"}, "spec": {"weight": 1}})
    assert created["metadata"]["uid"]
    assert read(k8s, "example.io/v1", "Queue", "default")["spec"] == {"weight": 1}
    listing = request(k8s, "GET", "/apis/example.io/v1")
    assert [(r["name"], r["namespaced"]) for r in listing["resources"]] == [("queues", False), ("queues/status", False)]
    assert "example.io" in {g["name"] for g in request(k8s, "GET", "/apis")["groups"]}
    assert delete(k8s, "example.io/v1", "Queue", "default") and not delete(k8s, "example.io/v1", "Queue", "default")
    assert read(k8s, "v1", "Pod", "absent", NS) is None
