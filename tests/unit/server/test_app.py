"""The admission app in process: recorded AdmissionReviews in, AdmissionReviews out."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import jsonpatch
import pytest
import yaml

from tests.helpers.jobs import volcano_job
from tests.helpers.paths import EXAMPLES, ROOT
from tests.helpers.schema import validate_pod

pytestmark = pytest.mark.anyio

REVIEWS = sorted((EXAMPLES / "admission").glob("*-pod*.json"))
RECORDED = ROOT / "tests" / "fixtures" / "admission"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def decoded_patch(response: dict) -> list:
    return json.loads(base64.b64decode(response["patch"]))


async def post(client, review: dict, path: str = "/mutate") -> dict:
    reply = await client.post(path, json=review)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["apiVersion"] == review["apiVersion"]
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == review["request"]["uid"]
    return body["response"]


@pytest.mark.parametrize("path", REVIEWS, ids=lambda p: p.stem)
async def test_recorded_reviews(client, path):
    review = load(path)
    response = await post(client, review)
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    patch = decoded_patch(response)
    assert patch == load(RECORDED / f"{path.stem}.patch.json")
    pod = jsonpatch.apply_patch(review["request"]["object"], patch)
    validate_pod(pod)
    # The wired Pod, seen again (reinvocation), needs nothing more.
    again = copy.deepcopy(review)
    again["request"]["object"] = pod
    assert "patch" not in await post(client, again)


async def test_pytorch_worker_values(client):
    review = load(EXAMPLES / "admission" / "pytorch-pod.json")
    pod = jsonpatch.apply_patch(review["request"]["object"], decoded_patch(await post(client, review)))
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["MASTER_ADDR"] == "pytorch-demo-master-0.pytorch-demo"
    assert (env["MASTER_PORT"], env["WORLD_SIZE"], env["RANK"]) == ("23456", "3", "2")
    assert pod["spec"]["hostname"] == "pytorch-demo-worker-1" and pod["spec"]["subdomain"] == "pytorch-demo"
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["wait-for-master"]


async def test_dry_run_gets_the_same_answer(client):
    review = load(EXAMPLES / "admission" / "mpi-pod.json")
    plain = await post(client, review)
    review["request"]["dryRun"] = True
    assert await post(client, review) == plain


async def test_pod_without_job_label_passes_unchanged(client):
    review = load(EXAMPLES / "admission" / "env-pod.json")
    del review["request"]["object"]["metadata"]["labels"]["volcano.sh/job-name"]
    assert await post(client, review) == {"uid": review["request"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("field", "value"),
    [("operation", "UPDATE"), ("operation", "DELETE"), ("kind", {"group": "", "version": "v1", "kind": "Service"})],
)
async def test_other_kinds_and_operations_pass_unchanged(client, field, value):
    review = load(EXAMPLES / "admission" / "env-pod.json")
    review["request"][field] = value
    assert await post(client, review) == {"uid": review["request"]["uid"], "allowed": True}


async def test_unknown_job_is_allowed_with_a_warning_and_counted(client):
    review = load(EXAMPLES / "admission" / "env-pod.json")
    review["request"]["object"]["metadata"]["labels"]["volcano.sh/job-name"] = "ghost"
    response = await post(client, review)
    assert response["allowed"] is True and "patch" not in response
    assert response["warnings"] == ["volcano-job-webhook: job default/ghost not found: Pod not wired by its plugins"]
    metrics = (await client.get("/metrics")).text
    assert 'volcano_webhook_job_lookups_total{result="not_found"} 1.0' in metrics
    assert 'volcano_webhook_admission_requests_total{endpoint="mutate",result="no-job"} 1.0' in metrics


def write_job(jobs_dir: Path, name: str, plugins: dict, tasks: list | None = None) -> None:
    job = yaml.safe_load((EXAMPLES / "jobs" / "pytorch-job.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["plugins"] = plugins
    if tasks is not None:
        job["spec"]["tasks"] = tasks
    (jobs_dir / f"{name}.yaml").write_text(yaml.safe_dump(job))


def pod_review_for(name: str, task: str = "worker", index: int = 0) -> dict:
    review = load(EXAMPLES / "admission" / "pytorch-pod.json")
    meta = review["request"]["object"]["metadata"]
    meta["name"] = f"{name}-{task}-{index}"
    meta["labels"]["volcano.sh/job-name"] = name
    meta["labels"]["volcano.sh/task-index"] = str(index)
    meta["annotations"]["volcano.sh/task-spec"] = task
    return review


@pytest.mark.parametrize(
    ("plugins", "expected"),
    [
        ({"nope": []}, "job default/broken: plugin nope: unknown plugin (known: "),
        ({"pytorch": ["--port=abc"]}, "job default/broken: plugin pytorch: --port: invalid value 'abc'"),
        ({"pytorch": ["--bogus"]}, "job default/broken: plugin pytorch: --bogus: flag provided but not defined"),
        ({"svc": ["--inject-hosts-env=maybe"]}, "job default/broken: plugin svc: --inject-hosts-env: invalid value 'maybe'"),
    ],
)
async def test_bad_plugin_configuration_is_denied(client, jobs_dir, plugins, expected):
    write_job(jobs_dir, "broken", plugins)
    response = await post(client, pod_review_for("broken"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"].startswith(expected)
    # /validate says the same at kubectl apply time.
    job = yaml.safe_load((jobs_dir / "broken.yaml").read_text())
    from volcano_job_webhook.server.admission import admission_review

    verdict = await post(client, admission_review(job, uid="v-1"), "/validate")
    assert verdict["allowed"] is False and verdict["status"]["message"] == response["status"]["message"]


async def test_too_long_hostname_is_denied(client, jobs_dir):
    name = "j" * 56  # "<name>-master-0" is 65 characters
    write_job(jobs_dir, name, {"svc": []})
    response = await post(client, pod_review_for(name, "worker", 1))
    assert response["allowed"] is False
    message = response["status"]["message"]
    assert message.startswith(f"job default/{name}: plugin svc: hostname of task 'master'")
    assert "over the DNS-1123 label limit of 63" in message


async def test_validate_allows_a_good_job_without_a_word_and_denies_a_broken_one(client):
    review = load(EXAMPLES / "admission" / "pytorch-job-validate.json")
    assert await post(client, review, "/validate") == {"uid": review["request"]["uid"], "allowed": True}
    broken = await post(client, load(EXAMPLES / "admission" / "broken-job-validate.json"), "/validate")
    assert broken["allowed"] is False
    assert broken["status"]["message"] == "job default/pytorch-demo: plugin pytorch: --port: invalid value 'abc': invalid syntax 'abc'"


async def test_validate_allows_a_job_the_chain_warns_about_with_the_warnings(client):
    from volcano_job_webhook.server.admission import admission_review

    job = volcano_job("tf-one", plugins={"tensorflow": []}, tasks=[("worker", 1)])
    response = await post(client, admission_review(job, uid="tf-one"), "/validate")
    assert response == {"uid": "tf-one", "allowed": True, "warnings": [
        "job default/tf-one: plugin tensorflow: the job has one task with one replica, which gets no TF_CONFIG (as in Volcano)",
    ]}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"not json", "not an AdmissionReview: not JSON"),
        (b"[]", "not an AdmissionReview: body: Input should be an object"),
        (b'{"kind": "Pod", "apiVersion": "admission.k8s.io/v1"}', "not an AdmissionReview: kind: Input should be 'AdmissionReview'"),
        (
            b'{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"kind": {"kind": "Pod"}, "operation": "CREATE"}}',
            "not an AdmissionReview: request.uid: Field required",
        ),
        (b"[" * 5000 + b"]" * 5000, "not an AdmissionReview: not JSON"),
    ],
)
async def test_malformed_bodies_get_400(client, body, error):
    reply = await client.post("/mutate", content=body, headers={"content-type": "application/json"})
    assert reply.status_code == 400
    assert reply.json()["error"].startswith(error)


async def test_body_over_the_limit_gets_413(client):
    review = load(EXAMPLES / "admission" / "env-pod.json")
    review["request"]["object"]["metadata"]["annotations"]["big"] = "x" * 70_000
    reply = await client.post("/mutate", json=review)
    assert reply.status_code == 413
    assert reply.json() == {"error": "body over the limit of 65536 bytes"}


async def test_object_that_is_not_a_pod_is_denied_with_400(client):
    review = load(EXAMPLES / "admission" / "env-pod.json")
    review["request"]["object"] = "nope"
    response = await post(client, review)
    assert response["allowed"] is False
    assert response["status"] == {"status": "Failure", "code": 400, "message": "request.object: missing or not a Pod"}


async def test_health_and_readiness(client):
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["jobs"] == len(list((EXAMPLES / "jobs").glob("*.yaml")))
    assert ready.json()["source"] == "files"


async def test_the_admission_paths_are_routes_documented_from_the_review_model(client):
    """/mutate and /validate are FastAPI routes; the OpenAPI document describes their body and answer
    with the AdmissionReview model, and a method other than POST gets the framework's 405."""
    document = (await client.get("/openapi.json")).json()
    review = document["components"]["schemas"]["AdmissionReview"]
    assert review["required"] == ["apiVersion", "kind"] and {"request", "response"} <= set(review["properties"])
    for path in ("/mutate", "/validate"):
        operation = document["paths"][path]["post"]
        assert operation["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/AdmissionReview"}
        assert operation["responses"]["200"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/AdmissionReview"}
        assert {"200", "400", "413"} <= set(operation["responses"])
        reply = await client.get(path)
        assert (reply.status_code, reply.headers["allow"]) == (405, "POST")
    assert {"/healthz", "/readyz", "/metrics"} <= set(document["paths"])


async def test_an_admission_asks_no_opentelemetry_provider(client, monkeypatch):
    """/metrics is the webhook's telemetry: FastAPI's OpenTelemetry hooks, on by default, asked three
    global providers (and the environment) on every request: 6.5 of the app's 116 µs an admission."""
    from opentelemetry import _logs, metrics, trace

    asked: list[str] = []

    def counted(name: str, own):
        def provider():
            asked.append(name)
            return own()
        return provider

    for module, name in ((trace, "get_tracer_provider"), (metrics, "get_meter_provider"), (_logs, "get_logger_provider")):
        monkeypatch.setattr(module, name, counted(name, getattr(module, name)))
    await post(client, load(EXAMPLES / "admission" / "pytorch-pod.json"))
    assert asked == []
