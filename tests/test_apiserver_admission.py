"""Admission as kube-apiserver does it and as the API-server double (tests/apiserver.py,
tests/admission.py) does it, driven through the official ``kubernetes`` client against a tiny HTTPS
webhook whose answers each test sets: which requests reach which webhook, what the AdmissionReview
holds, and what the client gets back for a patch, a denial, a failed call, warnings. Why the double:
the scenarios beside Volcano run on it where kube-apiserver is missing (part (b) of the double), so
every test here runs on both (fixture ``server``; the real one skips without ``KUBEBUILDER_ASSETS``)
and a difference between them fails here.

On the real server, which the whole session shares, every webhook registered here is fenced to the
test: it selects the test's namespace and objects labelled with it (unless the test sets a selector
of its own), and it is deleted at the end. A registration is in effect once a sentinel webhook added
to its configuration has been called (about a second on the real server)."""

from __future__ import annotations

import base64
import copy
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster import SERVERS, ServerNamespace, api_server
from tests.envtest import apply, create, delete, free_port, new_namespace, read, request, status_message, wait_until
from tests.servers import Raw, Slow, TinyWebhook, denying, patching, tiny_webhook
from volcano_job_webhook.certs.issue import generate_ca

FENCE = "admission-test"
SENTINEL = "/sentinel"
KINDS = {"mutating": "MutatingWebhookConfiguration", "validating": "ValidatingWebhookConfiguration"}


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> Iterator[ServerNamespace]:
    with api_server(request.param, request) as found:
        yield found


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


Register = Callable[..., str]


@pytest.fixture
def register(server: ServerNamespace, webhook: TinyWebhook) -> Iterator[Register]:
    """``register(kind, *hooks, name="test")``: the configuration applied, fenced (see the module
    docstring), and in effect; returns its name on this server. Every one is deleted at the end."""
    registered: dict[str, str] = {}

    def register_(kind: str, *hooks: dict[str, Any], name: str = "test") -> str:
        full = registered.setdefault(name, f"{name}-{server.namespace}")
        token = uuid.uuid4().hex[:12]
        fenced = [fence(server, h) for h in hooks]
        sentinel = {**hook("sentinel.test.io", webhook.url + SENTINEL, webhook.ca_bundle, resources=("configmaps",)),
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": server.namespace}},
                    "objectSelector": {"matchLabels": {"sentinel": token}}}
        apply(server.admin, {"apiVersion": "admissionregistration.k8s.io/v1", "kind": KINDS[kind], "metadata": {"name": full},
                             "webhooks": [*fenced, sentinel]})
        probe = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "sentinel", "namespace": server.namespace, "labels": {"sentinel": token}}}

        def called() -> bool:
            create(server.admin, probe, dry_run=True)
            return any(r[0] == SENTINEL and r[2]["request"]["object"]["metadata"]["labels"] == {"sentinel": token}
                       for r in webhook.reviews)
        wait_until(called, 20, f"the {KINDS[kind]} {full} to take effect")
        webhook.reviews[:] = [r for r in webhook.reviews if r[0] != SENTINEL]
        return full

    yield register_
    for full in registered.values():
        for kind in KINDS.values():
            delete(server.admin, "admissionregistration.k8s.io/v1", kind, full)


def fence(server: ServerNamespace, hook_: dict[str, Any]) -> dict[str, Any]:
    """``hook_`` calling only for this test: its namespace and objects labelled with it (for a
    selector the test did not set)."""
    out = copy.deepcopy(hook_)
    out.setdefault("namespaceSelector", {"matchLabels": {"kubernetes.io/metadata.name": server.namespace}})
    out.setdefault("objectSelector", {"matchLabels": {FENCE: server.namespace}})
    return out


def labels_of(server: ServerNamespace, labels: dict[str, str] | None = None) -> dict[str, str]:
    return {FENCE: server.namespace, **(labels or {})}


def pod(server: ServerNamespace, name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": server.namespace, "labels": labels_of(server, labels)},
            "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


def called(webhook: TinyWebhook) -> list[str]:
    """The paths ``webhook`` was called on, each once, sorted. Once each is all kube-apiserver
    promises for an UPDATE: it runs admission inside its storage's update function, first on the
    watch cache's copy, and again on etcd's when that copy was stale, calling every webhook again."""
    return sorted(set(webhook.paths()))


def requests(webhook: TinyWebhook) -> list[dict[str, Any]]:
    return [review["request"] for _, _, review in webhook.reviews]


def of_a_job(obj: dict[str, Any] | None) -> bool:
    return "volcano.sh/job-name" in ((obj or {}).get("metadata") or {}).get("labels", {})


def error_of(exc: pytest.ExceptionInfo[ApiException]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(exc.value.body)
    return body


# -- who is called ---------------------------------------------------------------


def test_a_mutating_webhook_patches_a_created_pod_and_sees_kube_apiservers_review(
        server: ServerNamespace, register: Register, webhook: TinyWebhook) -> None:
    webhook.answers["/mutate"] = patching({"op": "add", "path": "/metadata/labels/wired", "value": "yes"})
    register("mutating", hook("m.test.io", webhook.url + "/mutate", webhook.ca_bundle, timeoutSeconds=7))
    created = create(server.admin, pod(server, "p", {"a": "b"}))
    assert created["metadata"]["labels"] == labels_of(server, {"a": "b", "wired": "yes"})
    assert read(server.admin, "v1", "Pod", "p", server.namespace)["metadata"]["labels"]["wired"] == "yes"
    ((path, query, review),) = webhook.reviews
    assert (path, query) == ("/mutate", "timeout=7s")
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    request_ = review["request"]
    assert request_["uid"] and request_["operation"] == "CREATE" and request_["dryRun"] is False
    assert request_["kind"] == request_["requestKind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request_["resource"] == request_["requestResource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (request_["namespace"], request_["name"]) == (server.namespace, "p")
    assert request_["object"]["metadata"]["labels"] == labels_of(server, {"a": "b"}) and request_["oldObject"] is None
    assert request_["options"]["kind"] == "CreateOptions" and request_["userInfo"]["username"]
    if server.double is not None:  # the double's record of the calls
        assert [(c.webhook, c.operation, c.resource, c.allowed, c.patched) for c in server.double.webhook_calls
                if c.webhook == "m.test.io"] == [("m.test.io", "CREATE", "pods", True, True)]


def test_rules_choose_operations_resources_and_subresources(server: ServerNamespace, register: Register, webhook: TinyWebhook) -> None:
    url, ca, ns = webhook.url, webhook.ca_bundle, server.namespace
    core = client.CoreV1Api(server.admin)
    register("validating",
             hook("create-pods.test.io", url + "/create-pods", ca),
             hook("update-any.test.io", url + "/update-any", ca, resources=("*",), operations=("UPDATE",)),
             hook("pod-status.test.io", url + "/pod-status", ca, resources=("pods/status",), operations=("*",)),
             hook("everything.test.io", url + "/everything", ca, resources=("*/*",), operations=("*",), group="*", version="*"),
             hook("cluster-only.test.io", url + "/cluster-only", ca,
                  rules=[{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": "Cluster"}]))
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cm", "labels": labels_of(server)}})
    assert webhook.paths() == ["/everything"]
    webhook.reviews.clear()
    create(server.admin, pod(server, "p"))
    assert sorted(webhook.paths()) == ["/create-pods", "/everything"]  # validating webhooks run in parallel
    webhook.reviews.clear()
    core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"x": "y"}}})
    assert called(webhook) == ["/everything", "/update-any"]
    webhook.reviews.clear()
    core.patch_namespaced_pod_status("p", ns, {"status": {"phase": "Running"}})
    assert called(webhook) == ["/everything", "/pod-status"]
    assert webhook.reviews[0][2]["request"]["subResource"] == "status"  # and "cluster-only" never: all of these are namespaced


def test_object_selector_matches_new_or_old_labels(server: ServerNamespace, register: Register, webhook: TinyWebhook) -> None:
    selector = {"matchExpressions": [{"key": "volcano.sh/job-name", "operator": "Exists"}]}
    register("mutating", hook("m.test.io", webhook.url + "/m", webhook.ca_bundle, operations=("CREATE", "UPDATE"), objectSelector=selector))
    core = client.CoreV1Api(server.admin)
    create(server.admin, pod(server, "plain"))
    assert webhook.reviews == []
    create(server.admin, pod(server, "of-a-job", {"volcano.sh/job-name": "j"}))
    assert len(webhook.reviews) == 1
    core.patch_namespaced_pod("of-a-job", server.namespace, {"metadata": {"labels": {"volcano.sh/job-name": None}}})
    assert [(of_a_job(r["oldObject"]), of_a_job(r["object"])) for r in requests(webhook)[1:]] in ([(True, False)], [(True, False)] * 2)
    core.patch_namespaced_pod("of-a-job", server.namespace, {"metadata": {"labels": {"other": "x"}}})
    # Only a try on a stale copy may call (see called()), and that copy still had the label.
    assert all(of_a_job(r["oldObject"]) for r in requests(webhook) if "other" in r["object"]["metadata"]["labels"])


def test_namespace_selector_sees_the_namespace_name_label(server: ServerNamespace, register: Register, webhook: TinyWebhook) -> None:
    team = f"t-{server.namespace}"
    chosen, excluded = new_namespace(server.admin, "chosen-", {"team": team}), new_namespace(server.admin, "excluded-", {"team": team})
    other = new_namespace(server.admin, "other-", {"team": "other"})
    selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [excluded]},
                                     {"key": "team", "operator": "In", "values": [team]}]}
    register("mutating", hook("m.test.io", webhook.url + "/m", webhook.ca_bundle, namespaceSelector=selector))
    for namespace in (chosen, excluded, other):
        create(server.admin, {**pod(server, "p"), "metadata": {"name": "p", "namespace": namespace, "labels": labels_of(server)}})
    assert [review["request"]["namespace"] for _, _, review in webhook.reviews] == [chosen]


def test_mutating_then_validating_each_seeing_the_changes_before_it(server: ServerNamespace, register: Register, webhook: TinyWebhook) -> None:
    url, ca = webhook.url, webhook.ca_bundle
    webhook.answers["/first"] = patching({"op": "add", "path": "/metadata/annotations", "value": {"first": "1"}})
    webhook.answers["/second"] = lambda review: (
        patching({"op": "add", "path": "/metadata/labels/second", "value": review["request"]["object"]["metadata"]["annotations"]["first"]})(review))
    seen: list[dict[str, Any]] = []
    webhook.answers["/check"] = lambda review: seen.append(review["request"]["object"]) or {"allowed": True}
    register("mutating", hook("first.test.io", url + "/first", ca), name="a")
    register("mutating", hook("second.test.io", url + "/second", ca), name="b")
    register("validating", hook("check.test.io", url + "/check", ca))
    create(server.admin, pod(server, "p"))
    assert webhook.paths() == ["/first", "/second", "/check"]  # configurations by name, validating last
    (final,) = seen
    assert final["metadata"]["labels"] == labels_of(server, {"second": "1"}) and final["metadata"]["annotations"] == {"first": "1"}
    assert final["metadata"]["uid"] and final["status"]["phase"] == "Pending"


# -- what the client gets back ----------------------------------------------------------


def test_a_denial_is_the_webhooks_status_with_kube_apiservers_message(server: ServerNamespace, register: Register,
                                                                      webhook: TinyWebhook) -> None:
    webhook.answers["/deny"] = denying("task 'x' is not in spec.tasks", code=403)
    register("mutating", hook("pods.example.io", webhook.url + "/deny", webhook.ca_bundle))
    with pytest.raises(ApiException) as info:
        create(server.admin, pod(server, "p"))
    assert info.value.status == 403
    body = error_of(info)
    assert body["message"] == "admission webhook \"pods.example.io\" denied the request: task 'x' is not in spec.tasks"
    assert body["status"] == "Failure"
    assert read(server.admin, "v1", "Pod", "p", server.namespace) is None
    webhook.answers["/deny"] = denying("no reason given")
    with pytest.raises(ApiException) as info:
        create(server.admin, pod(server, "p"))
    assert info.value.status == 400  # under 400 (here none) is raised to 400, as ToStatusErr does


def test_a_validating_denial_stops_an_update_the_mutating_webhooks_allowed(server: ServerNamespace, register: Register,
                                                                           webhook: TinyWebhook) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cm", "labels": labels_of(server)}, "data": {"a": "1"}})
    webhook.answers["/v"] = lambda review: {"allowed": review["request"]["object"]["data"]["a"] == "1",
                                            "status": {"code": 422, "reason": "Invalid", "message": "a must stay 1"}}
    register("validating", hook("v.test.io", webhook.url + "/v", webhook.ca_bundle, resources=("configmaps",), operations=("UPDATE",)))
    with pytest.raises(ApiException) as info:
        core.patch_namespaced_config_map("cm", ns, {"data": {"a": "2"}})
    assert info.value.status == 422 and error_of(info)["reason"] == "Invalid"
    assert status_message(info.value) == 'admission webhook "v.test.io" denied the request: a must stay 1'
    review = webhook.reviews[-1][2]["request"]
    assert review["oldObject"]["data"] == {"a": "1"} and review["object"]["data"] == {"a": "2"}
    assert core.read_namespaced_config_map("cm", ns).data == {"a": "1"}


def test_a_delete_is_admitted_with_the_old_object(server: ServerNamespace, register: Register, webhook: TinyWebhook) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    core.create_namespaced_config_map(ns, {"metadata": {"name": "keep", "labels": labels_of(server)}})
    webhook.answers["/v"] = denying("kept")
    register("validating", hook("v.test.io", webhook.url + "/v", webhook.ca_bundle, resources=("configmaps",), operations=("DELETE",)))
    with pytest.raises(ApiException) as info:
        core.delete_namespaced_config_map("keep", ns)
    assert info.value.status == 400
    review = webhook.reviews[-1][2]["request"]
    assert review["operation"] == "DELETE" and review["object"] is None and review["oldObject"]["metadata"]["name"] == "keep"
    assert review["options"]["kind"] == "DeleteOptions"
    assert core.read_namespaced_config_map("keep", ns) is not None


def test_warnings_come_back_as_warning_headers(server: ServerNamespace, register: Register, webhook: TinyWebhook) -> None:
    webhook.answers["/w"] = lambda review: {"allowed": True, "warnings": ['plugin "svc": left "out"', "second"]}
    register("validating", hook("w.test.io", webhook.url + "/w", webhook.ca_bundle))
    warnings: list[str] = []
    request(server.admin, "POST", f"/api/v1/namespaces/{server.namespace}/pods", body=pod(server, "p"), warnings=warnings)
    assert warnings == ['plugin "svc": left "out"', "second"]


@pytest.mark.parametrize(("answer", "timeout", "expected"), [
    (Raw(500, b"boom"), 10, 'failed to call webhook: an error on the server ("unknown") has prevented the request from succeeding'),
    (Raw(200, b"not json"), 10, "failed to call webhook: couldn't get version/kind; json parse error: "),
    (lambda review: {"uid": "someone-else", "allowed": True}, 10, 'expected response.uid="'),
    (Slow(2.0, {"allowed": True}), 1, "context deadline exceeded"),
], ids=["http-500", "invalid-json", "wrong-uid", "timeout"])
def test_a_failed_call_fails_closed_or_is_ignored(server: ServerNamespace, register: Register, webhook: TinyWebhook,
                                                  answer: Any, timeout: int, expected: str) -> None:
    webhook.answers["/f"] = answer if callable(answer) else (lambda review: answer)
    closed = hook("closed.test.io", webhook.url + "/f", webhook.ca_bundle, timeoutSeconds=timeout)
    register("mutating", closed, name="closed")
    with pytest.raises(ApiException) as info:
        create(server.admin, pod(server, "p"))
    assert info.value.status == 500 and error_of(info)["reason"] == "InternalError"
    message = status_message(info.value)
    assert message.startswith('Internal error occurred: failed calling webhook "closed.test.io": ') and expected in message
    assert read(server.admin, "v1", "Pod", "p", server.namespace) is None
    register("mutating", {**closed, "failurePolicy": "Ignore"}, name="closed")
    create(server.admin, pod(server, "p"))
    assert read(server.admin, "v1", "Pod", "p", server.namespace) is not None


def test_an_unreachable_or_untrusted_webhook_fails_the_call(server: ServerNamespace, register: Register, webhook: TinyWebhook) -> None:
    other_ca, _ = generate_ca("someone-else")
    port = free_port()
    register("validating", hook("refused.test.io", f"https://127.0.0.1:{port}/v", webhook.ca_bundle), name="refused")
    with pytest.raises(ApiException) as info:
        create(server.admin, pod(server, "p"))
    assert f"dial tcp 127.0.0.1:{port}: connect: connection refused" in status_message(info.value)
    register("validating", hook("untrusted.test.io", webhook.url + "/v", base64.b64encode(other_ca).decode()), name="refused")
    with pytest.raises(ApiException) as info:
        create(server.admin, pod(server, "p"))
    assert "tls: failed to verify certificate: x509" in status_message(info.value)
    assert webhook.reviews == []
    service = {"service": {"namespace": "volcano-job-webhook", "name": "volcano-job-webhook", "path": "/validate"}}
    register("validating", {**hook("in-cluster.test.io", "", ""), "clientConfig": service}, name="refused")
    with pytest.raises(ApiException) as info:
        create(server.admin, pod(server, "p"))
    assert status_message(info.value).startswith(
        'Internal error occurred: failed calling webhook "in-cluster.test.io": failed to call webhook: '
        'Post "https://volcano-job-webhook.volcano-job-webhook.svc:443/validate?timeout=10s": ')


def test_dry_run_is_admitted_and_stores_nothing(server: ServerNamespace, register: Register, webhook: TinyWebhook) -> None:
    webhook.answers["/m"] = patching({"op": "add", "path": "/metadata/labels/wired", "value": "yes"})
    register("mutating", hook("m.test.io", webhook.url + "/m", webhook.ca_bundle))
    would_be = create(server.admin, pod(server, "p"), dry_run=True)
    assert would_be["metadata"]["labels"]["wired"] == "yes"
    assert webhook.reviews[-1][2]["request"]["dryRun"] is True
    assert read(server.admin, "v1", "Pod", "p", server.namespace) is None
