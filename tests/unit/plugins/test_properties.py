"""Property tests: for generated Volcano Jobs and Pods, the chain either wires the Pod or refuses it
with a message naming the job; a wired Pod validates against the Kubernetes schema; the patch applies;
running the chain twice equals running it once; the server never answers 5xx.

CI runs a bounded number of examples; ``HYPOTHESIS_PROFILE=long pytest tests/unit/plugins/test_properties.py``
runs the long fuzz (docs/benchmarks.md#fuzzing-and-property-tests has its figures).
"""

from __future__ import annotations

import asyncio
import copy
import os
import string

import httpx
import jsonpatch
import kubernetes_validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.jobs import volcano_job
from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.admission import admission_review
from volcano_job_webhook.server.app import create_app
from volcano_job_webhook.server.patch import make_patch

settings.register_profile("ci", max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=20_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ROLE_NAMES = ["master", "worker", "ps", "chief", "evaluator", "head", "mpimaster", "mpi-worker", "launcher"]
label = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=6)
task_name = st.one_of(st.sampled_from(ROLE_NAMES), label, st.builds(lambda a, b: f"{a}-{b}", label, label))

FLAG_TOKENS = {
    "env": [[]],
    "svc": [[], ["--publish-not-ready-addresses"], ["--disable-network-policy=true"], ["--inject-hosts-env=false"], ["--bogus"]],
    "ssh": [[], ["--ssh-port=2222"], ["--ssh-key-file-path=/home/u/.ssh"], ["--ssh-port=0"]],
    "pytorch": [[], ["--port=29500"], ["--wait-master-enabled"], ["--master=chief", "--worker=ps"], ["--port=abc"]],
    "tensorflow": [[], ["--port=2223"], ["--worker=head"], ["-port", "0x10"]],
    "mpi": [[], ["--master=mpimaster", "--worker=mpi-worker"], ["--port=2022"]],
    "ray": [[], ["--clientServerPort=10002"], ["--headContainer=c0"], ["--head=master"]],
    "hcclrank": [[], ["--master=chief"]],
    "xgboost": [[], ["--tracker=worker"], ["--port=9999"], ["--port=0"]],
    "paddle": [[], ["--master=head"], ["-port", "36543"], ["--bogus"]],
}


@st.composite
def jobs(draw: st.DrawFn) -> dict:
    names = draw(st.lists(task_name, min_size=1, max_size=3, unique=True))
    tasks = []
    for name in names:
        containers = [
            {"name": f"c{i}", "image": "busybox:1.36.1", **draw(st.sampled_from([{}, {"env": [{"name": "RANK", "value": "7"}]},
                                                                            {"ports": [{"containerPort": 22, "protocol": "TCP"}]}]))}
            for i in range(draw(st.integers(1, 2)))
        ]
        spec: dict = {"containers": containers}
        if draw(st.booleans()):
            spec["initContainers"] = [{"name": "init", "image": "busybox:1.36.1"}]
        if draw(st.integers(0, 5)) == 0:
            spec["hostname"] = draw(label)
        tasks.append({"name": name, "replicas": draw(st.integers(0, 4)), "template": {"spec": spec}})
    plugins = {}
    for plugin in draw(st.lists(st.sampled_from(sorted(FLAG_TOKENS)), max_size=4, unique=True)):
        plugins[plugin] = draw(st.sampled_from(FLAG_TOKENS[plugin]))
    job_name = draw(st.one_of(label, st.just("j" * 58), st.just("9lives")))
    return volcano_job(job_name, namespace="ns", uid="uid-1", plugins=plugins, tasks=tasks)


@st.composite
def job_and_pod(draw: st.DrawFn) -> tuple[dict, dict]:
    job = draw(jobs())
    parsed = Job.from_object(job)
    task = draw(st.sampled_from(parsed.tasks))
    index = draw(st.integers(0, max(task.replicas - 1, 0)))
    return job, make_pod(parsed, task.name, index)


CHAIN = Chain()


@given(job_and_pod())
def test_chain_wires_validly_or_refuses_clearly(case):
    job_obj, pod = case
    job = Job.from_object(job_obj)
    before = copy.deepcopy(pod)
    try:
        result = CHAIN.mutate(job, pod)
    except PluginError as exc:
        assert str(exc).startswith("job ns/" + job.name + ": ")
        return
    assert pod == before, "the input Pod is never modified"
    patch = make_patch(pod, result.pod)
    assert jsonpatch.apply_patch(pod, patch) == result.pod
    kubernetes_validate.validate(result.pod, "1.30", strict=True)
    again = CHAIN.mutate(job, result.pod)
    assert again.pod == result.pod, "running the chain twice equals running it once"
    assert make_patch(result.pod, again.pod) == []


class _Jobs:
    """A job source holding one generated job."""

    def __init__(self, job: dict) -> None:
        self.job = job
        self.ready = True

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def status(self) -> dict:
        return {}

    def __len__(self) -> int:
        return 1

    async def get(self, namespace: str, name: str, uid: str | None = None, kind: object = None) -> dict | None:
        meta = self.job["metadata"]
        return self.job if (namespace, name) == (meta["namespace"], meta["name"]) else None


@given(job_and_pod(), st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"]))
def test_server_never_answers_5xx_and_its_patches_apply(case, api_version):
    job_obj, pod = case
    review = admission_review(pod, api_version=api_version, uid="u-1")

    async def go() -> httpx.Response:
        app = create_app(_Jobs(job_obj), CHAIN)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://t") as c:
            return await c.post("/mutate", json=review)

    reply = asyncio.run(go())
    assert reply.status_code == 200
    response = reply.json()["response"]
    if not response["allowed"]:
        assert response["status"]["code"] in (400, 403)
        assert response["status"]["message"].startswith(f"job ns/{job_obj['metadata']['name']}: ")
        return
    if "patch" in response:
        import base64
        import json

        wired = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        kubernetes_validate.validate(wired, "1.30", strict=True)
