"""The API-server double (tests/helpers/apiserver.py) itself, driven only through the official ``kubernetes``
client. Why the double: its faults and the rest of its part (a) (tests/helpers/apiserver.py), which no real
server stages on cue, are tested on it alone; its part (b), what the tests on a machine without
kube-apiserver take from it, is tested on both servers (fixture ``server``: the double, then the
session's kube-apiserver, which skips without ``KUBEBUILDER_ASSETS``), so where the double and
kube-apiserver differ, a test here fails."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.helpers.apiserver import FakeApiServer
from tests.helpers.cluster import SERVERS, ServerNamespace, api_server
from tests.helpers.envtest import create, delete, read, request, wait_until
from tests.helpers.jobs import owner_reference, volcano_job

VOLCANO = ("batch.volcano.sh", "v1alpha1")
NS = "default"  # on the double alone


@pytest.fixture(params=SERVERS)
def server(request: pytest.FixtureRequest) -> Iterator[ServerNamespace]:
    with api_server(request.param, request) as found:
        yield found


@pytest.fixture(autouse=True)
def no_thread_outlives_the_double() -> Iterator[None]:
    """Set up before the double (autouse), so checked after it stopped."""
    yield
    assert not [t for t in threading.enumerate() if t.name.startswith("fake-apiserver")]


def configmap(name: str, labels: dict[str, str] | None = None, **data: str) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data}


def status_of(err: ApiException) -> dict:
    return json.loads(err.body)


def names(listing: client.V1ConfigMapList) -> list[str]:
    return [i.metadata.name for i in listing.items]


# (b) CRUD, on both servers ------------------------------------------------------------------------


def test_create_get_and_server_filled_metadata(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    created = core.create_namespaced_config_map(ns, configmap("a", k="v"))
    assert isinstance(created, client.V1ConfigMap)
    assert created.kind == "ConfigMap" and created.api_version == "v1"
    assert created.metadata.namespace == ns and created.metadata.uid and created.metadata.resource_version
    assert created.metadata.creation_timestamp is not None
    got = core.read_namespaced_config_map("a", ns)
    assert got.data == {"k": "v"} and got.metadata.uid == created.metadata.uid

    generated = core.create_namespaced_config_map(ns, {"metadata": {"generateName": "gen-"}})
    assert generated.metadata.name.startswith("gen-") and len(generated.metadata.name) == 9


def test_missing_object_is_404_not_found_status(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("nope", ns)
    assert exc.value.status == 404
    assert status_of(exc.value) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'configmaps "nope" not found', "reason": "NotFound",
        "details": {"name": "nope", "kind": "configmaps"}, "code": 404}
    for call in (lambda: core.replace_namespaced_config_map("nope", ns, configmap("nope")),
                 lambda: core.patch_namespaced_config_map("nope", ns, {"data": {"a": "b"}}),
                 lambda: core.delete_namespaced_config_map("nope", ns)):
        with pytest.raises(ApiException) as exc:
            call()
        assert exc.value.status == 404


def test_create_existing_is_409_already_exists(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    core.create_namespaced_config_map(ns, configmap("a"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(ns, configmap("a"))
    assert exc.value.status == 409
    assert status_of(exc.value)["reason"] == "AlreadyExists"
    assert status_of(exc.value)["message"] == 'configmaps "a" already exists'


def test_update_with_stale_resource_version_is_409_conflict(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    first = core.create_namespaced_config_map(ns, configmap("a", k="1"))
    first.data = {"k": "2"}
    second = core.replace_namespaced_config_map("a", ns, first)
    assert second.data == {"k": "2"} and second.metadata.resource_version != first.metadata.resource_version

    first.data = {"k": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_config_map("a", ns, first)
    assert exc.value.status == 409
    assert status_of(exc.value)["reason"] == "Conflict"
    assert status_of(exc.value)["message"] == ('Operation cannot be fulfilled on configmaps "a": the object has been modified; '
                                               "please apply your changes to the latest version and try again")

    first.metadata.resource_version = None  # no resourceVersion: unconditional update
    assert core.replace_namespaced_config_map("a", ns, first).data == {"k": "3"}


def test_noop_update_keeps_resource_version(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    cm = core.create_namespaced_config_map(ns, configmap("a", k="v"))
    again = core.patch_namespaced_config_map("a", ns, {"data": {"k": "v"}})
    assert again.metadata.resource_version == cm.metadata.resource_version


def test_merge_and_json_patch(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    core.create_namespaced_config_map(ns, configmap("a", labels={"x": "1"}, k="v", drop="me"))
    # a dict body goes out as a strategic merge patch (the client picks it)
    merged = core.patch_namespaced_config_map("a", ns, {"data": {"new": "1", "drop": None}})
    assert merged.data == {"k": "v", "new": "1"}
    merged = core.patch_namespaced_config_map(
        "a", ns, {"metadata": {"labels": {"y": "2"}}}, _content_type="application/merge-patch+json")
    assert merged.metadata.labels == {"x": "1", "y": "2"}
    # a list body goes out as a JSON patch
    patched = core.patch_namespaced_config_map("a", ns, [
        {"op": "replace", "path": "/data/k", "value": "w"},
        {"op": "remove", "path": "/metadata/labels/x"}])
    assert patched.data["k"] == "w" and patched.metadata.labels == {"y": "2"}
    with pytest.raises(ApiException) as exc:  # a failing test op is 422
        core.patch_namespaced_config_map("a", ns, [{"op": "test", "path": "/data/k", "value": "zzz"}])
    assert exc.value.status == 422
    with pytest.raises(ApiException) as exc:  # resourceVersion in a patch is a precondition
        core.patch_namespaced_config_map("a", ns, {"metadata": {"resourceVersion": patched.metadata.resource_version + "0"}})
    assert exc.value.status == 409


def test_server_side_apply_creates_then_merges(server: ServerNamespace) -> None:
    ns = server.namespace
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": ns}, "data": {"k": "v"}}
    path = f"/api/v1/namespaces/{ns}/configmaps/a"
    query = [("fieldManager", "test"), ("force", "true")]
    created = request(server.admin, "PATCH", path, body=body, content_type="application/apply-patch+yaml", query=query)
    assert created["data"] == {"k": "v"} and created["metadata"]["uid"]
    body["data"]["k"] = "w"
    updated = request(server.admin, "PATCH", path, body=body, content_type="application/apply-patch+yaml", query=query)
    assert updated["data"] == {"k": "w"} and updated["metadata"]["uid"] == created["metadata"]["uid"]


def test_delete_answers_status_and_honours_a_uid_precondition(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    created = core.create_namespaced_config_map(ns, configmap("a"))
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_config_map("a", ns, body={"preconditions": {"uid": "someone-else"}})
    assert exc.value.status == 409
    assert status_of(exc.value)["message"] == (
        f'Operation cannot be fulfilled on ConfigMap "a": the UID in the precondition (someone-else) does not match the UID '
        f"in record ({created.metadata.uid}). The object might have been deleted and then recreated")
    answer = core.delete_namespaced_config_map("a", ns, body={"preconditions": {"uid": created.metadata.uid}})
    assert answer["status"] == "Success"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("a", ns)
    assert exc.value.status == 404


# (b) list and watch, on both servers --------------------------------------------------------------


def test_list_with_label_selectors_and_pages(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    core.create_namespaced_config_map(ns, configmap("a", labels={"app": "x", "tier": "web"}))
    core.create_namespaced_config_map(ns, configmap("b", labels={"app": "y"}))
    core.create_namespaced_config_map(ns, configmap("c", labels={"app": "x"}))

    assert names(core.list_namespaced_config_map(ns, label_selector="app=x")) == ["a", "c"]
    assert names(core.list_namespaced_config_map(ns, label_selector="app==x,tier=web")) == ["a"]
    assert names(core.list_namespaced_config_map(ns, label_selector="tier")) == ["a"]
    first = core.list_namespaced_config_map(ns, limit=1, label_selector="app=x")
    assert names(first) == ["a"] and first.metadata._continue
    assert first.metadata.remaining_item_count is None  # counted only for a list without a selector
    rest = core.list_namespaced_config_map(ns, limit=1, label_selector="app=x", _continue=first.metadata._continue)
    assert names(rest) == ["c"] and not rest.metadata._continue
    assert rest.metadata.resource_version == first.metadata.resource_version  # the list's, from the token
    listing = core.list_namespaced_config_map(ns, label_selector="app=x")
    assert listing.kind == "ConfigMapList" and listing.metadata.resource_version
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map(ns, limit=1, _continue="bm90LWpzb24=")
    assert exc.value.status == 400


def test_watch_replays_from_a_resource_version_or_starts_with_what_exists(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    core.create_namespaced_config_map(ns, configmap("before"))
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, configmap("a"))
    core.patch_namespaced_config_map("a", ns, {"data": {"k": "v"}})
    core.delete_namespaced_config_map("a", ns)
    w = watch.Watch()
    seen = []
    for event in w.stream(core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=5):
        assert isinstance(event["object"], client.V1ConfigMap)
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            w.stop()
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]

    # without a resourceVersion the watch starts with ADDED for what exists
    initial = [(e["type"], e["object"].metadata.name) for e in w.stream(core.list_namespaced_config_map, ns, timeout_seconds=1)]
    assert initial == [("ADDED", "before")]


def test_label_selected_watch_sees_objects_leave_and_enter(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    core.create_namespaced_config_map(ns, configmap("a", labels={"app": "x"}))
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.patch_namespaced_config_map("a", ns, {"metadata": {"labels": {"app": "y"}}})
    core.patch_namespaced_config_map("a", ns, {"metadata": {"labels": {"app": "x"}}})
    w = watch.Watch()
    seen = []
    for event in w.stream(core.list_namespaced_config_map, ns, label_selector="app=x", resource_version=rv, timeout_seconds=5):
        seen.append(event["type"])
        if len(seen) == 2:
            w.stop()
    assert seen == ["DELETED", "ADDED"]


# (b) kinds, subresources and validation, on both servers --------------------------------------------


def test_volcano_jobs_through_custom_objects_api(server: ServerNamespace) -> None:
    custom, ns = client.CustomObjectsApi(server.admin), server.namespace
    created = custom.create_namespaced_custom_object(*VOLCANO, ns, "jobs", volcano_job("j", namespace=ns, tasks=[("worker", 2)]))
    assert created["kind"] == "Job" and created["metadata"]["uid"]
    assert custom.get_namespaced_custom_object(*VOLCANO, ns, "jobs", "j")["spec"]["tasks"][0]["replicas"] == 2
    listed = custom.list_namespaced_custom_object(*VOLCANO, ns, "jobs")
    assert listed["kind"] == "JobList" and listed["items"][0]["kind"] == "Job"  # custom resources' items keep kind
    patched = custom.patch_namespaced_custom_object(*VOLCANO, ns, "jobs", "j", {"spec": {"queue": "q"}})  # a merge patch
    assert patched["spec"]["queue"] == "q"
    with pytest.raises(ApiException) as exc:
        custom.get_namespaced_custom_object(*VOLCANO, ns, "jobs", "missing")
    assert status_of(exc.value)["message"] == 'jobs.batch.volcano.sh "missing" not found'
    assert custom.delete_namespaced_custom_object(*VOLCANO, ns, "jobs", "j")["status"] == "Success"


def test_status_subresource_writes_only_status(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}, "status": {"phase": "Running"}}
    assert core.create_namespaced_pod(ns, pod).status.phase == "Pending"  # whatever it was sent with
    core.patch_namespaced_pod("p", ns, {"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Failed"}})
    assert core.read_namespaced_pod("p", ns).status.phase == "Pending"
    core.patch_namespaced_pod_status("p", ns, {"spec": {"activeDeadlineSeconds": 5}, "status": {"phase": "Succeeded"}})
    stored = core.read_namespaced_pod("p", ns)
    assert stored.status.phase == "Succeeded" and stored.spec.active_deadline_seconds is None
    custom = client.CustomObjectsApi(server.admin)
    job = volcano_job("j", namespace=ns, tasks=[("t", 1)], status={"state": {"phase": "Running"}})
    assert "status" not in custom.create_namespaced_custom_object(*VOLCANO, ns, "jobs", job)
    custom.patch_namespaced_custom_object_status(*VOLCANO, ns, "jobs", "j", {"metadata": {"labels": {"a": "b"}}, "spec": {"queue": "q"},
                                                                           "status": {"state": {"phase": "Pending"}}})
    stored_job = custom.get_namespaced_custom_object(*VOLCANO, ns, "jobs", "j")
    assert stored_job["status"] == {"state": {"phase": "Pending"}} and "queue" not in stored_job["spec"]
    assert not stored_job["metadata"].get("labels")


def test_a_created_crd_is_served_and_its_group_version_listed(server: ServerNamespace) -> None:
    group = f"t{uuid.uuid4().hex[:8]}.example.io"
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": f"queues.{group}"},
           "spec": {"group": group, "scope": "Cluster",
                    "names": {"kind": "Queue", "plural": "queues", "singular": "queue", "listKind": "QueueList"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    create(server.admin, crd)
    try:
        def established() -> bool:
            stored = read(server.admin, "apiextensions.k8s.io/v1", "CustomResourceDefinition", crd["metadata"]["name"]) or {}
            return any(c["type"] == "Established" and c["status"] == "True" for c in (stored.get("status") or {}).get("conditions") or [])
        wait_until(established, 20, "the CRD to be established")
        queue = {"apiVersion": f"{group}/v1", "kind": "Queue", "metadata": {"name": "default"}, "spec": {"weight": 1}}
        created = wait_until(lambda: _created(server, queue), 20, "the Queue kind to be served")
        assert created["metadata"]["uid"]
        assert read(server.admin, f"{group}/v1", "Queue", "default")["spec"] == {"weight": 1}
        listing = request(server.admin, "GET", f"/apis/{group}/v1")
        assert [(r["name"], r["namespaced"]) for r in listing["resources"]] == [("queues", False), ("queues/status", False)]
        assert delete(server.admin, f"{group}/v1", "Queue", "default") and not delete(server.admin, f"{group}/v1", "Queue", "default")
    finally:
        delete(server.admin, "apiextensions.k8s.io/v1", "CustomResourceDefinition", crd["metadata"]["name"])


def _created(server: ServerNamespace, obj: dict) -> dict | None:
    try:
        return create(server.admin, obj)
    except ApiException as exc:
        if exc.status == 404:  # not served yet: the real server takes a moment after Established
            return None
        raise


def test_two_controller_owner_references_are_invalid(server: ServerNamespace) -> None:
    core, ns = client.CoreV1Api(server.admin), server.namespace
    one = {"metadata": {"name": "cm", "ownerReferences": [owner_reference("a", "1"), owner_reference("b", "2", controller=False)]}}
    core.create_namespaced_config_map(ns, one)
    with pytest.raises(ApiException) as info:
        core.patch_namespaced_config_map("cm", ns, {"metadata": {"ownerReferences": [owner_reference("a", "1"), owner_reference("b", "2")]}})
    assert info.value.status == 422
    body = status_of(info.value)
    assert body["reason"] == "Invalid" and body["details"]["causes"][0]["field"] == "metadata.ownerReferences"
    assert body["message"].startswith('ConfigMap "cm" is invalid: metadata.ownerReferences: Invalid value: [{"apiVersion":')
    assert body["message"].endswith('Only one reference can have Controller set to true. Found "true" in references for Job/a and Job/b')
    assert len(core.read_namespaced_config_map("cm", ns).metadata.owner_references) == 2


def test_a_webhook_configuration_takes_a_json_patch(server: ServerNamespace) -> None:
    adm = client.AdmissionregistrationV1Api(server.admin)
    name = f"test-{server.namespace}"
    webhook = {"name": "jobs.volcano.example", "sideEffects": "None", "admissionReviewVersions": ["v1"],
               "clientConfig": {"service": {"name": "svc", "namespace": server.namespace, "path": "/mutate"}},
               "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": f"nowhere-{server.namespace}"}},
               "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}
    adm.create_mutating_webhook_configuration({"metadata": {"name": name}, "webhooks": [webhook]})
    try:
        # a JSON patch, as the certificates' sync sends: only caBundle changes, the rest of the webhook stays
        patched = adm.patch_mutating_webhook_configuration(name, [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="}])
        hook = patched.webhooks[0]
        assert hook.client_config.ca_bundle == "Q0E=" and hook.client_config.service.name == "svc"
        assert hook.rules[0].resources == ["pods"] and patched.metadata.namespace is None
        assert name in [w.metadata.name for w in adm.list_mutating_webhook_configuration().items]
    finally:
        adm.delete_mutating_webhook_configuration(name)


# (a) on the double alone: faults, restarts, history, the request log, the store -------------------------


def test_pages_are_never_stale_though_not_a_snapshot(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    """The double keeps a list's sorted keys between pages; a write in between shows in the next page
    (the real server's pages are a snapshot at the list's resourceVersion: the watch from it catches up)."""
    for name in ("a", "c", "e"):
        core.create_namespaced_config_map(NS, configmap(name, labels={"app": "x"}))
    first = core.list_namespaced_config_map(NS, limit=1, label_selector="app=x")
    assert names(first) == ["a"]
    core.create_namespaced_config_map(NS, configmap("b", labels={"app": "x"}))
    core.delete_namespaced_config_map("e", NS)
    rest = core.list_namespaced_config_map(NS, limit=5, label_selector="app=x", _continue=first.metadata._continue)
    assert names(rest) == ["b", "c"] and not rest.metadata._continue


def test_set_based_selectors_are_refused_by_name(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map(NS, label_selector="app in (x,y)")
    assert exc.value.status == 400 and "only key=value and key label selectors, not 'app in (x'" in status_of(exc.value)["message"]


def test_load_stores_objects_as_creates_do_and_forgets_the_history(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    custom = client.CustomObjectsApi(api_double.api_client())
    core.create_namespaced_config_map(NS, configmap("before"))
    old_rv = core.list_namespaced_config_map(NS).metadata.resource_version
    jobs = [volcano_job(f"j{i}") | {"status": {"state": {"phase": "Completed"}}} for i in range(3)]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}
    assert api_double.load([*jobs, service]) == 4

    listed = custom.list_cluster_custom_object(*VOLCANO, "jobs", limit=2)
    assert [j["metadata"]["name"] for j in listed["items"]] == ["j0", "j1"]
    assert len({j["metadata"]["resourceVersion"] for j in listed["items"]} | {old_rv}) == 3
    assert all(j["status"] == {"state": {"phase": "Completed"}} and j["metadata"]["uid"] for j in listed["items"])
    stored = core.read_namespaced_service("s", NS)  # defaulted as a create is
    assert stored.spec.type == "ClusterIP" and stored.spec.cluster_ip and stored.spec.ports[0].target_port == 80

    with pytest.raises(ValueError, match="taken"):
        api_double.load([volcano_job("j0")])
    with pytest.raises(ApiException) as exc:  # nobody saw the load: a watch from before it lists again
        list(watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=old_rv, timeout_seconds=1))
    assert exc.value.status == 410


def test_put_object_stores_as_is_and_objects_reads_the_store(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    seeded = api_double.put_object(volcano_job("seeded") | {"status": {"state": {"phase": "Pending"}}})
    custom = client.CustomObjectsApi(api_double.api_client())
    assert custom.get_namespaced_custom_object(*VOLCANO, NS, "jobs", "seeded")["status"] == seeded["status"]
    assert [o["metadata"]["name"] for o in api_double.objects("jobs")] == ["seeded"]
    assert api_double.delete_object("jobs", "seeded", NS) is not None and api_double.get_object("jobs", "seeded", NS) is None
    assert [r.verb for r in api_double.requests] == ["get"], "the store's own reads and writes are no requests"


def test_watch_from_expired_resource_version_raises_410(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NS, configmap("a"))
    old_rv = core.list_namespaced_config_map(NS).metadata.resource_version
    api_double.expire_history()

    # with timeout_seconds the client does not retry: the ERROR event becomes ApiException(410)
    with pytest.raises(ApiException) as exc:
        list(watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=old_rv, timeout_seconds=2))
    assert exc.value.status == 410
    assert exc.value.reason.startswith("Expired: too old resource version")

    # without it the client retries once from the same resourceVersion, then raises
    api_double.clear_requests()
    with pytest.raises(ApiException) as exc:
        list(watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=old_rv))
    assert exc.value.status == 410
    assert [r.verb for r in api_double.requests] == ["watch", "watch"]

    # a fresh list gives a resourceVersion that can be watched again
    fresh = core.list_namespaced_config_map(NS).metadata.resource_version
    assert list(watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=fresh, timeout_seconds=1)) == []


def test_close_watches_ends_stream_and_client_rewatches(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    seen: list[str] = []
    rv = core.list_namespaced_config_map(NS).metadata.resource_version

    def consume() -> None:
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_config_map, NS, resource_version=rv):
            seen.append(event["object"].metadata.name)
            w.stop()

    thread = threading.Thread(target=consume)
    thread.start()
    assert api_double.wait_for_watches(1)
    api_double.clear_requests()
    assert api_double.close_watches() == 1
    # the client sees the stream end and re-watches from its last resourceVersion,
    # so an object created in between is not missed
    core.create_namespaced_config_map(NS, configmap("after-close"))
    thread.join(timeout=5)
    assert seen == ["after-close"]
    assert sorted(r.verb for r in api_double.requests) == ["create", "watch"]


def test_bookmarks_on_cue_and_at_an_interval(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    rv = core.list_namespaced_config_map(NS).metadata.resource_version
    threading.Timer(0.2, lambda: api_double.wait_for_watches(1) and api_double.send_bookmarks()).start()
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_config_map, NS, allow_watch_bookmarks=True, resource_version=rv, timeout_seconds=5):
        assert event["type"] == "BOOKMARK"
        w.stop()
    assert w.resource_version == rv  # the client keeps the bookmark's rv

    api_double.bookmark_interval = 0.1
    events = list(watch.Watch().stream(core.list_namespaced_config_map, NS, allow_watch_bookmarks=True,
                                       resource_version=rv, timeout_seconds=1))
    assert events and {e["type"] for e in events} == {"BOOKMARK"}
    assert events[-1]["raw_object"]["metadata"]["resourceVersion"] == rv


def test_injected_500_and_429_with_retry_after(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    api_double.fail_next(1, 500, method="GET")
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map(NS)
    assert exc.value.status == 500 and status_of(exc.value)["reason"] == "InternalError"

    api_double.fail_next(1, 429, method="POST", retry_after=3)
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(NS, configmap("a"))
    assert exc.value.status == 429 and exc.value.headers["Retry-After"] == "3"
    assert status_of(exc.value)["details"] == {"retryAfterSeconds": 3}

    # urllib3 itself retries GETs (up to 3 times) on 429/503 with Retry-After, sleeping as told
    api_double.clear_requests()
    api_double.fail_next(1, 429, method="GET", retry_after=0)
    assert core.list_namespaced_config_map(NS).kind == "ConfigMapList"
    assert [r.status for r in api_double.requests] == [429, 200]
    api_double.clear_requests()
    api_double.fail_next(4, 429, method="GET", retry_after=0)  # ...and then gives up with the last answer
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map(NS)
    assert exc.value.status == 429 and [r.status for r in api_double.requests] == [429] * 4


def test_dropped_connection_raises_urllib3_errors(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    api_double.drop_next(1, method="POST")
    with pytest.raises(urllib3.exceptions.ProtocolError, match="Connection aborted"):  # not retried: POST is not idempotent
        core.create_namespaced_config_map(NS, configmap("a"))
    api_double.drop_next(1, method="GET")  # urllib3 retries an idempotent GET transparently
    assert core.list_namespaced_config_map(NS).kind == "ConfigMapList"
    api_double.drop_next(4, method="GET")
    with pytest.raises(urllib3.exceptions.MaxRetryError) as exc:
        core.list_namespaced_config_map(NS)
    assert isinstance(exc.value.reason, urllib3.exceptions.ProtocolError)


def test_restart_keeps_port_and_objects(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map(NS, configmap("a", k="v"))
    core.create_namespaced_config_map(NS, configmap("b"))
    port = api_double.port
    api_double.restart()
    assert api_double.port == port
    assert core.read_namespaced_config_map("a", NS).metadata.uid == created.metadata.uid
    with pytest.raises(ApiException) as exc:  # the watch history did not survive the restart
        list(watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=created.metadata.resource_version,
                                  timeout_seconds=1))
    assert exc.value.status == 410


def test_stop_ends_open_watch_promptly(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    """An open watch ends with stop(), cleanly, not at its own timeout (an hour here)."""
    done = threading.Event()
    failures: list[BaseException] = []

    def consume() -> None:
        try:
            list(watch.Watch().stream(core.list_namespaced_config_map, NS, timeout_seconds=3600))
        except BaseException as exc:
            failures.append(exc)
        finally:
            done.set()

    threading.Thread(target=consume, daemon=True).start()
    assert api_double.wait_for_watches(1)
    api_double.stop()
    assert done.wait(30) and failures == []
    api_double.start()


def test_request_log_records_verbs_resources_and_user_agents(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    api_double.clear_requests()
    core.create_namespaced_config_map(NS, configmap("a"))
    core.read_namespaced_config_map("a", NS)
    core.list_namespaced_config_map(NS, label_selector="x=y")
    core.replace_namespaced_config_map("a", NS, configmap("a"))
    core.patch_namespaced_config_map("a", NS, {"data": {"k": "v"}})
    w = watch.Watch()
    for _ in w.stream(core.list_namespaced_config_map, NS, timeout_seconds=5):
        w.stop()  # the synthetic ADDED for "a"
    core.delete_namespaced_config_map("a", NS)
    other = api_double.api_client()
    other.user_agent = "someone-else"
    client.CustomObjectsApi(other).create_namespaced_custom_object(*VOLCANO, NS, "jobs", volcano_job("j"))
    records = api_double.requests
    assert [r.verb for r in records] == ["create", "get", "list", "update", "patch", "watch", "delete", "create"]
    assert records[2].query == {"labelSelector": "x=y"}
    assert records[1].path == "/api/v1/namespaces/default/configmaps/a"
    assert {(r.group, r.resource) for r in records} == {("", "configmaps"), ("batch.volcano.sh", "jobs")}
    assert [r.user_agent for r in records][-1] == "someone-else" != records[0].user_agent


def test_kubeconfig_loads_with_the_official_loader(api_double: FakeApiServer, tmp_path) -> None:
    from kubernetes import config

    path = api_double.kubeconfig(str(tmp_path / "kubeconfig"))
    with config.new_client_from_config(config_file=path) as api_client:
        assert client.CoreV1Api(api_client).list_namespaced_config_map("kube-system").items == []
