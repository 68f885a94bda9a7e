"""The budgets against a real kube-apiserver and etcd (the session's ``envtest``, skipped without
``KUBEBUILDER_ASSETS``): what Volcano would produce past a limit is rejected there, and what the
chain produces instead is accepted. This is where the limits in ``plugins/budget.py`` were measured."""

from __future__ import annotations

import base64
import copy
from typing import Any

import pytest
from kubernetes import client as kube_client
from kubernetes.client.rest import ApiException

from tests.helpers.envtest import create as create_object
from tests.helpers.envtest import delete, status_message
from tests.helpers.jobs import volcano_job
from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.podgen import make_pod

NAMESPACE = "default"  # the jobs' own; objects are created in the test's namespace


@pytest.fixture
def api(kube_admin: kube_client.ApiClient, kube_namespace: str) -> tuple[kube_client.ApiClient, str]:
    return kube_admin, kube_namespace


def create(api: tuple[kube_client.ApiClient, str], obj: dict[str, Any]) -> tuple[int, str]:
    """Create ``obj`` for real (stored in etcd, so etcd's limit applies) and delete it again: the
    answer's status code and, for a refusal, its message."""
    client, namespace = api
    body = copy.deepcopy(obj)
    meta = body["metadata"]
    meta["namespace"] = namespace
    meta.pop("ownerReferences", None)  # no Job here to own it
    try:
        create_object(client, body)
    except ApiException as exc:
        return int(exc.status), status_message(exc)
    delete(client, body["apiVersion"], body["kind"], meta["name"], namespace)
    return 201, ""


Api = tuple[kube_client.ApiClient, str]


def job_of(plugins: dict[str, list[str]], tasks: list[tuple[str, int]], **pod: Any) -> Job:
    return Job.from_object(volcano_job("big", plugins=plugins, tasks=tasks, namespace=NAMESPACE, uid="u-1", image="x:1", pod=pod))


def test_duplicate_mount_path_rejected_there_refused_here(api: Api) -> None:
    job = job_of({"svc": []}, [("main", 1)],
                 containers=[{"name": "main", "image": "x:1", "volumeMounts": [{"name": "conf", "mountPath": "/etc/volcano"}]}],
                 volumes=[{"name": "conf", "emptyDir": {}}])
    volcano = make_pod(job, "main", 0)  # what Volcano's svc makes of it: a second mount at the path
    volcano["spec"]["volumes"].append({"name": "big-svc", "configMap": {"name": "big-svc"}})
    volcano["spec"]["containers"][0]["volumeMounts"].append({"name": "big-svc", "mountPath": "/etc/volcano"})
    code, message = create(api, volcano)
    assert code == 422 and 'mountPath: Invalid value: "/etc/volcano": must be unique' in message
    with pytest.raises(PluginError, match="'/etc/volcano'"):
        Chain().mutate(job, make_pod(job, "main", 0))


def test_duplicate_port_name_rejected_there_refused_here(api: Api) -> None:
    job = job_of({"mpi": []}, [("master", 1), ("worker", 1)],
                 containers=[{"name": "main", "image": "x:1", "ports": [{"name": "mpijob-port", "containerPort": 2222}]}])
    volcano = make_pod(job, "worker", 0)
    volcano["spec"]["containers"][0]["ports"].append({"name": "mpijob-port", "containerPort": 22})
    code, message = create(api, volcano)
    assert code == 422 and 'ports[1].name: Duplicate value: "mpijob-port"' in message
    with pytest.raises(PluginError, match="'mpijob-port'"):
        Chain().mutate(job, make_pod(job, "worker", 0))


def test_port_number_already_there_is_accepted(api: Api) -> None:
    job = job_of({"mpi": []}, [("master", 1), ("worker", 1)],
                 containers=[{"name": "main", "image": "x:1", "ports": [{"name": "ssh", "containerPort": 22}]}])
    pod = Chain().mutate(job, make_pod(job, "worker", 0)).pod
    assert create(api, pod)[0] == 201


def test_ten_thousand_tasks_accepted(api: Api) -> None:
    job = job_of({"svc": []}, [(f"t{i}", 1) for i in range(10_000)])
    chain = Chain()
    assert create(api, chain.mutate(job, make_pod(job, "t0", 0)).pod)[0] == 201
    for obj in chain.resources(job):
        assert create(api, obj)[0] == 201, obj["kind"]


def test_config_map_keys_left_out_accepted_volcano_rejected(api: Api) -> None:
    job = job_of({"svc": []}, [("w", 40_000)])
    ours = Chain().resources(job)[0]
    assert create(api, ours)[0] == 201
    volcano = copy.deepcopy(ours)
    volcano["data"]["VC_W_HOSTS"] = volcano["data"]["w.host"].replace("\n", ",")
    code, message = create(api, volcano)
    assert code == 422 and "may not be more than 1048576 bytes" in message


def test_mpi_ten_thousand_workers_accepted(api: Api) -> None:
    job = job_of({"mpi": []}, [("master", 1), ("worker", 10_000)])
    chain = Chain()
    assert create(api, chain.mutate(job, make_pod(job, "master", 0)).pod)[0] == 201
    for obj in chain.resources(job):
        assert create(api, obj)[0] == 201, obj["kind"]


def test_ssh_config_without_host_entries_accepted_volcano_rejected(api: Api) -> None:
    job = job_of({"ssh": []}, [("master", 1), ("worker", 20_000)])
    (ours,) = Chain().resources(job)
    assert create(api, ours)[0] == 201
    volcano = copy.deepcopy(ours)
    hosts = [f"Host {h}\n  HostName {h}.big\n  Port 22\n" for t in job.tasks for h in job.host_labels(t)]
    volcano["data"]["config"] = base64.b64encode(("StrictHostKeyChecking no\nUserKnownHostsFile /dev/null\n" + "".join(hosts)).encode()).decode()
    code, message = create(api, volcano)
    assert code == 422 and "may not be more than 1048576 bytes" in message


def test_pod_over_etcd_limit_rejected_there_refused_here(api: Api) -> None:
    containers = [{"name": f"c{i}", "image": "x:1"} for i in range(14)]
    job = job_of({"mpi": ["--port=2222"]}, [("master", 1), ("worker", 6_000)], containers=containers)
    with pytest.raises(PluginError, match="plugin mpi: Pod: "):
        Chain().mutate(job, make_pod(job, "master", 0))
    volcano = make_pod(job, "master", 0)
    hosts = ",".join(job.host_names(job.task("worker")))
    for container in volcano["spec"]["containers"]:
        container["env"] = [{"name": "MPI_HOST", "value": hosts}]
    code, message = create(api, volcano)
    assert code == 500 and "request is too large" in message
