"""Tests of the API-server double (tests/apiserver.py), driven only through the
official ``kubernetes`` client so that they pin down what that client really
does against real REST semantics (status codes, retries, watch errors). Only
what the fault tests rely on; kube-apiserver itself is tests/envtest.py."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterator

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.apiserver import FakeApiServer
from tests.jobs import volcano_job

NS = "default"
VOLCANO = ("batch.volcano.sh", "v1alpha1")

# The double serves Jobs without a Pod template; a Job here needs none.
worker_job = functools.partial(volcano_job, namespace=NS, tasks=[{"name": "worker", "replicas": 2}], minAvailable=1)


@pytest.fixture(autouse=True)
def no_thread_outlives_the_double() -> Iterator[None]:
    """Set up before api_double (autouse), so checked after it stopped."""
    yield
    assert not [t for t in threading.enumerate() if t.name.startswith("fake-apiserver")]


@pytest.fixture
def custom(k8s: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(k8s)


def configmap(name: str, labels: dict[str, str] | None = None, **data: str) -> dict:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data}


def status_of(err: ApiException) -> dict:
    return json.loads(err.body)


# -- CRUD ----------------------------------------------------------------------


def test_create_get_and_server_filled_metadata(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map(NS, configmap("a", k="v"))
    assert isinstance(created, client.V1ConfigMap)
    assert created.kind == "ConfigMap" and created.api_version == "v1"
    assert created.metadata.namespace == NS and created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert created.metadata.resource_version == str(api_double.resource_version)
    got = core.read_namespaced_config_map("a", NS)
    assert got.data == {"k": "v"} and got.metadata.uid == created.metadata.uid

    generated = core.create_namespaced_config_map(NS, {"metadata": {"generateName": "gen-"}})
    assert generated.metadata.name.startswith("gen-") and len(generated.metadata.name) == 9


def test_missing_object_is_404_not_found_status(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("nope", NS)
    assert exc.value.status == 404
    assert status_of(exc.value) == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": 'configmaps "nope" not found', "reason": "NotFound",
        "details": {"name": "nope", "group": "", "kind": "configmaps"}, "code": 404}
    for call in (lambda: core.replace_namespaced_config_map("nope", NS, configmap("nope")),
                 lambda: core.patch_namespaced_config_map("nope", NS, {"data": {"a": "b"}}),
                 lambda: core.delete_namespaced_config_map("nope", NS)):
        with pytest.raises(ApiException) as exc:
            call()
        assert exc.value.status == 404


def test_create_existing_is_409_already_exists(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NS, configmap("a"))
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map(NS, configmap("a"))
    assert exc.value.status == 409
    assert status_of(exc.value)["reason"] == "AlreadyExists"
    assert status_of(exc.value)["message"] == 'configmaps "a" already exists'


def test_update_with_stale_resource_version_is_409_conflict(core: client.CoreV1Api) -> None:
    first = core.create_namespaced_config_map(NS, configmap("a", k="1"))
    first.data = {"k": "2"}
    second = core.replace_namespaced_config_map("a", NS, first)
    assert second.data == {"k": "2"}
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)

    first.data = {"k": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as exc:
        core.replace_namespaced_config_map("a", NS, first)
    assert exc.value.status == 409
    body = status_of(exc.value)
    assert body["reason"] == "Conflict" and "the object has been modified" in body["message"]

    first.metadata.resource_version = None  # no resourceVersion: unconditional update
    assert core.replace_namespaced_config_map("a", NS, first).data == {"k": "3"}


def test_noop_update_keeps_resource_version(core: client.CoreV1Api) -> None:
    cm = core.create_namespaced_config_map(NS, configmap("a", k="v"))
    again = core.patch_namespaced_config_map("a", NS, {"data": {"k": "v"}})
    assert again.metadata.resource_version == cm.metadata.resource_version


def test_merge_and_json_patch(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NS, configmap("a", labels={"x": "1"}, k="v", drop="me"))
    # a dict body goes out as a strategic merge patch (the client picks it), served as a merge patch
    merged = core.patch_namespaced_config_map("a", NS, {"data": {"new": "1", "drop": None}})
    assert merged.data == {"k": "v", "new": "1"}
    merged = core.patch_namespaced_config_map(
        "a", NS, {"metadata": {"labels": {"y": "2"}}}, _content_type="application/merge-patch+json")
    assert merged.metadata.labels == {"x": "1", "y": "2"}
    # a list body goes out as a JSON patch
    patched = core.patch_namespaced_config_map("a", NS, [
        {"op": "replace", "path": "/data/k", "value": "w"},
        {"op": "remove", "path": "/metadata/labels/x"}])
    assert patched.data["k"] == "w" and patched.metadata.labels == {"y": "2"}
    with pytest.raises(ApiException) as exc:  # a failing test op is 422
        core.patch_namespaced_config_map("a", NS, [{"op": "test", "path": "/data/k", "value": "zzz"}])
    assert exc.value.status == 422
    with pytest.raises(ApiException) as exc:  # resourceVersion in a patch is a precondition
        core.patch_namespaced_config_map("a", NS, {"metadata": {"resourceVersion": "1"}})
    assert exc.value.status == 409


def test_delete_answers_status_and_honours_a_uid_precondition(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map(NS, configmap("a"))
    with pytest.raises(ApiException) as exc:
        core.delete_namespaced_config_map("a", NS, body={"preconditions": {"uid": "someone-else"}})
    assert exc.value.status == 409 and "Precondition failed" in status_of(exc.value)["message"]
    answer = core.delete_namespaced_config_map("a", NS, body={"preconditions": {"uid": created.metadata.uid}})
    assert answer["status"] == "Success"
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_config_map("a", NS)
    assert exc.value.status == 404


# -- list and watch ---------------------------------------------------------------


def test_list_with_label_selectors_and_pages(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NS, configmap("a", labels={"app": "x", "tier": "web"}))
    core.create_namespaced_config_map(NS, configmap("b", labels={"app": "y"}))
    core.create_namespaced_config_map("other", configmap("c", labels={"app": "x"}))

    def names(**kw: str) -> list[str]:
        return [i.metadata.name for i in core.list_config_map_for_all_namespaces(**kw).items]

    assert names(label_selector="app=x") == ["a", "c"]
    assert names(label_selector="app!=x") == ["b"]
    assert names(label_selector="tier") == ["a"]
    assert names(label_selector="!tier") == ["b", "c"]
    assert names(label_selector="app in (x,y),tier") == ["a"]
    page = core.list_namespaced_config_map(NS, limit=1)
    assert [i.metadata.name for i in page.items] == ["a"] and page.metadata._continue
    rest = core.list_namespaced_config_map(NS, limit=1, _continue=page.metadata._continue)
    assert [i.metadata.name for i in rest.items] == ["b"] and not rest.metadata._continue
    listing = core.list_namespaced_config_map(NS)
    assert listing.kind == "ConfigMapList" and listing.metadata.resource_version


def test_pages_follow_writes_made_between_them(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    # The sorted keys are kept between pages; a write in between must show in the next page.
    for name in ("a", "c", "e"):
        core.create_namespaced_config_map(NS, configmap(name, labels={"app": "x"}))
    first = core.list_namespaced_config_map(NS, limit=1, label_selector="app=x")
    assert [i.metadata.name for i in first.items] == ["a"] and first.metadata.remaining_item_count == 2
    core.create_namespaced_config_map(NS, configmap("b", labels={"app": "x"}))
    core.delete_namespaced_config_map("e", NS)
    rest = core.list_namespaced_config_map(NS, limit=5, label_selector="app=x", _continue=first.metadata._continue)
    assert [i.metadata.name for i in rest.items] == ["b", "c"] and not rest.metadata._continue
    assert rest.metadata.resource_version == first.metadata.resource_version  # the list's, from the token
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_config_map(NS, limit=1, _continue="bm90LWpzb24=")
    assert exc.value.status == 400


def test_load_stores_objects_as_creates_do_and_forgets_the_history(api_double: FakeApiServer, core: client.CoreV1Api,
                                                                   custom: client.CustomObjectsApi) -> None:
    core.create_namespaced_config_map(NS, configmap("before"))
    old_rv = str(api_double.resource_version)
    jobs = [volcano_job(f"j{i}") | {"status": {"state": {"phase": "Completed"}}} for i in range(3)]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {"ports": [{"port": 80}]}}
    assert api_double.load([*jobs, service]) == 4
    assert api_double.resource_version == int(old_rv) + 4

    listed = custom.list_cluster_custom_object(*VOLCANO, "jobs", limit=2)
    assert [j["metadata"]["name"] for j in listed["items"]] == ["j0", "j1"]
    assert [j["metadata"]["resourceVersion"] for j in listed["items"]] == [str(int(old_rv) + 1), str(int(old_rv) + 2)]
    assert all(j["status"] == {"state": {"phase": "Completed"}} and j["metadata"]["uid"] for j in listed["items"])
    stored = core.read_namespaced_service("s", NS)  # defaulted as a create is
    assert stored.spec.type == "ClusterIP" and stored.spec.cluster_ip and stored.spec.ports[0].target_port == 80

    with pytest.raises(ValueError, match="taken"):
        api_double.load([volcano_job("j0")])
    with pytest.raises(ApiException) as exc:  # nobody saw the load: a watch from before it lists again
        list(watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=old_rv, timeout_seconds=1))
    assert exc.value.status == 410


def test_watch_streams_added_modified_deleted(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NS, configmap("before"))
    rv = core.list_namespaced_config_map(NS).metadata.resource_version

    def writer() -> None:
        assert api_double.wait_for_watches(1)
        core.create_namespaced_config_map(NS, configmap("a"))
        core.patch_namespaced_config_map("a", NS, {"data": {"k": "v"}})
        core.delete_namespaced_config_map("a", NS)

    thread = threading.Thread(target=writer)
    thread.start()
    w = watch.Watch()
    seen = []
    for event in w.stream(core.list_namespaced_config_map, NS, resource_version=rv, timeout_seconds=5):
        assert isinstance(event["object"], client.V1ConfigMap)
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "DELETED":
            w.stop()
    thread.join()
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]

    # without a resourceVersion the watch starts with ADDED for what exists
    initial = [(e["type"], e["object"].metadata.name)
               for e in w.stream(core.list_namespaced_config_map, NS, timeout_seconds=1)]
    assert initial == [("ADDED", "before")]


def test_label_selected_watch_sees_objects_leave_and_enter(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NS, configmap("a", labels={"app": "x"}))
    rv = core.list_namespaced_config_map(NS).metadata.resource_version
    core.patch_namespaced_config_map("a", NS, {"metadata": {"labels": {"app": "y"}}})
    core.patch_namespaced_config_map("a", NS, {"metadata": {"labels": {"app": "x"}}})
    w = watch.Watch()
    seen = []
    for event in w.stream(core.list_namespaced_config_map, NS, label_selector="app=x",
                          resource_version=rv, timeout_seconds=5):
        seen.append(event["type"])
        if len(seen) == 2:
            w.stop()
    assert seen == ["DELETED", "ADDED"]


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
    assert list(watch.Watch().stream(core.list_namespaced_config_map, NS, resource_version=fresh,
                                     timeout_seconds=1)) == []


def test_close_watches_ends_stream_and_client_rewatches(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    seen: list[str] = []

    def consume() -> None:
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_config_map, NS, resource_version=str(api_double.resource_version)):
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


def test_bookmarks(api_double: FakeApiServer, core: client.CoreV1Api) -> None:
    threading.Timer(0.2, lambda: api_double.wait_for_watches(1) and api_double.send_bookmarks()).start()
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_config_map, NS, allow_watch_bookmarks=True,
                          resource_version=str(api_double.resource_version), timeout_seconds=5):
        assert event["type"] == "BOOKMARK"
        w.stop()
    assert w.resource_version == str(api_double.resource_version)  # the client keeps the bookmark's rv

    api_double.bookmark_interval = 0.1
    events = list(watch.Watch().stream(core.list_namespaced_config_map, NS, allow_watch_bookmarks=True,
                                       resource_version=str(api_double.resource_version), timeout_seconds=1))
    assert events and {e["type"] for e in events} == {"BOOKMARK"}
    assert events[-1]["raw_object"]["metadata"]["resourceVersion"] == str(api_double.resource_version)


# -- custom and cluster-scoped resources ----------------------------------------------


def test_volcano_jobs_through_custom_objects_api(api_double: FakeApiServer, custom: client.CustomObjectsApi) -> None:
    group, version = VOLCANO
    created = custom.create_namespaced_custom_object(group, version, NS, "jobs", worker_job("j"))
    assert created["kind"] == "Job" and created["metadata"]["uid"]
    got = custom.get_namespaced_custom_object(group, version, NS, "jobs", "j")
    assert got["spec"]["tasks"][0]["replicas"] == 2
    listed = custom.list_cluster_custom_object(group, version, "jobs")
    assert listed["kind"] == "JobList" and listed["items"][0]["kind"] == "Job"  # CR items keep kind
    # CustomObjectsApi sends merge patches; strategic merge is refused for custom resources
    patched = custom.patch_namespaced_custom_object(group, version, NS, "jobs", "j", {"spec": {"queue": "q"}})
    assert patched["spec"]["queue"] == "q"
    with pytest.raises(ApiException) as exc:
        custom.patch_namespaced_custom_object(group, version, NS, "jobs", "j", {"spec": {}},
                                              _content_type="application/strategic-merge-patch+json")
    assert exc.value.status == 415
    with pytest.raises(ApiException) as exc:
        custom.get_namespaced_custom_object(group, version, NS, "jobs", "missing")
    assert status_of(exc.value)["message"] == 'jobs.batch.volcano.sh "missing" not found'
    seeded = api_double.put_object(worker_job("seeded") | {"status": {"state": {"phase": "Pending"}}})
    assert custom.get_namespaced_custom_object(group, version, NS, "jobs", "seeded")["status"] == seeded["status"]
    assert custom.delete_namespaced_custom_object(group, version, NS, "jobs", "j")["status"] == "Success"
    assert [o["metadata"]["name"] for o in api_double.objects("jobs")] == ["seeded"]


def test_mutating_webhook_configuration_patch(k8s: client.ApiClient) -> None:
    adm = client.AdmissionregistrationV1Api(k8s)
    webhook = {"name": "jobs.volcano.example", "sideEffects": "None", "admissionReviewVersions": ["v1"],
               "clientConfig": {"service": {"name": "svc", "namespace": NS, "path": "/mutate"}},
               "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}
    adm.create_mutating_webhook_configuration({"metadata": {"name": "volcano-job-webhook"}, "webhooks": [webhook]})
    # a JSON patch, as the certs command sends: only caBundle changes, the rest of the webhook stays
    patched = adm.patch_mutating_webhook_configuration("volcano-job-webhook", [
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="}])
    hook = patched.webhooks[0]
    assert hook.client_config.ca_bundle == "Q0E=" and hook.client_config.service.name == "svc"
    assert hook.rules[0].resources == ["pods"]
    assert patched.metadata.namespace is None
    assert [w.metadata.name for w in adm.list_mutating_webhook_configuration().items] == ["volcano-job-webhook"]


# -- faults, restart, request log ------------------------------------------------


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


def test_request_log_records_verbs_and_resources(api_double: FakeApiServer, core: client.CoreV1Api,
                                                 custom: client.CustomObjectsApi) -> None:
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
    custom.create_namespaced_custom_object(*VOLCANO, NS, "jobs", worker_job("j"))
    records = api_double.requests
    assert [r.verb for r in records] == ["create", "get", "list", "update", "patch", "watch", "delete", "create"]
    assert records[2].query == {"labelSelector": "x=y"}
    assert records[1].path == "/api/v1/namespaces/default/configmaps/a"
    assert {(r.group, r.resource) for r in records} == {("", "configmaps"), ("batch.volcano.sh", "jobs")}


def test_kubeconfig_loads_with_the_official_loader(api_double: FakeApiServer, tmp_path) -> None:
    from kubernetes import config

    path = api_double.kubeconfig(str(tmp_path / "kubeconfig"))
    with config.new_client_from_config(config_file=path) as api_client:
        assert client.CoreV1Api(api_client).list_namespaced_config_map("kube-system").items == []
