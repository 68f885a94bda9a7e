"""The init containers we add are sized as the Pod's first container (cpu, memory and
ephemeral-storage, requests and limits), so that they change neither what the Pod asks for nor its
QoS class; pytorch's ``wait-for-master`` stays as Volcano makes it (tests/apiserver/
test_init_container_resources.py admits such Pods through a real quota and LimitRange)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.jobs import INIT_CONTAINER_CASES, volcano_job
from volcano_job_webhook.plugins import Chain, Job
from volcano_job_webhook.plugins.podgen import make_pod

FIRST = {"requests": {"cpu": "2", "memory": "1Gi", "ephemeral-storage": "1Gi", "nvidia.com/gpu": "1"},
         "limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"}}
SIDECAR = {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "50m", "memory": "32Mi"}}
SIZED = {"requests": {"cpu": "2", "memory": "1Gi", "ephemeral-storage": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}


def init_container(case: str, containers: list[dict[str, Any]]) -> dict[str, Any]:
    plugins, tasks, task, name = INIT_CONTAINER_CASES[case]
    job = Job.from_object(volcano_job("sized", plugins=plugins, tasks=tasks, uid="u-1", pod={"containers": containers}))
    pod = Chain().mutate(job, make_pod(job, task, 0)).pod
    found: dict[str, Any] = next(c for c in pod["spec"]["initContainers"] if c["name"] == name)
    return found


@pytest.mark.parametrize("case", INIT_CONTAINER_CASES)
def test_sized_as_the_first_container_without_extended_resources(case: str) -> None:
    containers = [{"name": "main", "image": "x:1", "resources": FIRST}, {"name": "side", "image": "x:1", "resources": SIDECAR}]
    assert init_container(case, containers)["resources"] == SIZED


@pytest.mark.parametrize("case", INIT_CONTAINER_CASES)
def test_no_resources_where_the_first_container_has_none(case: str) -> None:
    containers = [{"name": "main", "image": "x:1"}, {"name": "side", "image": "x:1", "resources": SIDECAR}]
    assert "resources" not in init_container(case, containers)


def test_pytorchs_wait_for_master_is_volcanos_without_resources() -> None:
    job = Job.from_object(volcano_job("pt", plugins={"pytorch": ["--master=master", "--worker=worker", "--wait-master-enabled=true"]}, uid="u-1",
                                      pod={"containers": [{"name": "main", "image": "x:1", "resources": FIRST}]}))
    pod = Chain().mutate(job, make_pod(job, "worker", 0)).pod
    assert [sorted(c) for c in pod["spec"]["initContainers"]] == [["command", "image", "name"]]
