"""Bad input, each case with the exact answer it gets. Nothing here may crash the server or yield 5xx."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import orjson
import pytest

from tests.helpers.jobs import volcano_job
from volcano_job_webhook.plugins.registry import BUILTINS
from volcano_job_webhook.server.admission import admission_review

pytestmark = pytest.mark.anyio


def job(name: str, plugins: dict, tasks: list[tuple[str, int]]) -> dict:
    return volcano_job(name, plugins=plugins, tasks=tasks, uid=f"uid-{name}")


def pod(job_name: str, task: str, index: int, env: list | None = None) -> dict:
    container: dict = {"name": "main", "image": "busybox:1.36.1"}
    if env:
        container["env"] = env
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": f"{job_name}-{task}-{index}", "namespace": "default",
            "labels": {"volcano.sh/job-name": job_name, "volcano.sh/task-index": str(index), "volcano.sh/task-spec": task},
            "annotations": {"volcano.sh/task-spec": task, "volcano.sh/task-index": str(index)},
        },
        "spec": {"containers": [container]},
    }


LONG = "a" * 55
JOBS = [
    job("unknown-plugin", {"horovod": []}, [("worker", 2)]),
    job("bad-flag", {"mpi": ["--prot=22"]}, [("master", 1), ("worker", 2)]),
    job("bad-value", {"ray": ["--dashboardPort=http"]}, [("head", 1), ("worker", 2)]),
    job("zero", {"svc": []}, [("master", 1), ("worker", 0)]),
    job("no-master", {"pytorch": []}, [("trainer", 2)]),
    job("tf-one", {"tensorflow": []}, [("worker", 1)]),
    job(LONG, {"ray": ["--head=h", "--worker=w"]}, [("h", 1), ("w", 1)]),
    job("long", {"svc": []}, [("w" * 60, 1)]),
    job("accents", {"env": []}, [("wörker", 1)]),
    job("dup-env", {"env": []}, [("worker", 2)]),
]


def denied(uid: str, message: str, code: int = 403) -> dict:
    return {"uid": uid, "allowed": False, "status": {"status": "Failure", "code": code, "message": message}}


CASES = {
    "unknown plugin": (
        pod("unknown-plugin", "worker", 0),
        denied("unknown plugin", "job default/unknown-plugin: plugin horovod: unknown plugin "
                                 f"(known: {', '.join(sorted(BUILTINS))})"),
    ),
    "unknown argument": (
        pod("bad-flag", "master", 0),
        denied("unknown argument", "job default/bad-flag: plugin mpi: --prot: flag provided but not defined; "
                                   "did you mean --port? (known flags: --master, --worker, --port)"),
    ),
    "malformed argument": (
        pod("bad-value", "head", 0),
        denied("malformed argument", "job default/bad-value: plugin ray: --dashboardPort: invalid value 'http': invalid syntax 'http'"),
    ),
    "ray head Service name over 63": (
        pod(LONG, "w", 0),
        denied("ray head Service name over 63", f"job default/{LONG}: plugin ray: head Service name: '{LONG}-head-svc' "
                                                "is 64 characters, over the DNS-1035 label limit of 63"),
    ),
    "hostname over 63": (
        pod("long", "w" * 60, 0),
        denied("hostname over 63", f"job default/long: plugin svc: hostname of task '{'w' * 60}': 'long-{'w' * 60}-0' "
                                   "is 67 characters, over the DNS-1123 label limit of 63"),
    ),
    "non-ASCII task name": (
        pod("accents", "wörker", 0),
        denied("non-ASCII task name", "job default/accents: spec.tasks[0].name: 'wörker' is not a DNS-1123 label "
                                      "(lower-case alphanumerics and '-', alphanumeric at both ends)"),
    ),
}

ALLOWED = {
    # case: (pod, warnings, {env name: value or configMapKeyRef key} the wired container must hold)
    "task with 0 replicas": (pod("zero", "master", 0), None, {"VC_WORKER_NUM": "VC_WORKER_NUM", "VC_WORKER_HOSTS": "VC_WORKER_HOSTS"}),
    "pytorch job with no master task": (
        pod("no-master", "trainer", 1),
        ["job default/no-master: plugin pytorch: --master: the job has no task 'master', so pytorch leaves its Pods alone (as Volcano does)"],
        {"VC_TRAINER_NUM": "VC_TRAINER_NUM"},
    ),
    "tensorflow with one replica": (
        pod("tf-one", "worker", 0),
        ["job default/tf-one: plugin tensorflow: the job has one task with one replica, which gets no TF_CONFIG (as in Volcano)"],
        {"VC_WORKER_NUM": "VC_WORKER_NUM"},
    ),
}


@pytest.fixture
async def bad_client(client, jobs_dir: Path):
    for obj in JOBS:
        (jobs_dir / f"{obj['metadata']['name'][:40]}.json").write_text(json.dumps(obj))
    return client


@pytest.mark.parametrize("case", sorted(CASES))
async def test_denied_with_exact_message(bad_client, case):
    pod_obj, expected = CASES[case]
    reply = await bad_client.post("/mutate", json=admission_review(pod_obj, uid=case))
    assert reply.status_code == 200
    assert reply.json()["response"] == expected


@pytest.mark.parametrize("case", sorted(ALLOWED))
async def test_allowed_with_exact_warnings(bad_client, case):
    pod_obj, warnings, env = ALLOWED[case]
    response = (await bad_client.post("/mutate", json=admission_review(pod_obj, uid=case))).json()["response"]
    assert response["allowed"] is True and response.get("warnings") == warnings
    import jsonpatch

    wired = jsonpatch.apply_patch(pod_obj, json.loads(base64.b64decode(response["patch"])))
    got = {e["name"]: e.get("value", e.get("valueFrom", {}).get("configMapKeyRef", {}).get("key")) for e in wired["spec"]["containers"][0]["env"]}
    assert env.items() <= got.items()
    assert "TF_CONFIG" not in got and "MASTER_ADDR" not in got


async def test_duplicate_env_names_in_the_pod(bad_client):
    dup = pod("dup-env", "worker", 1, [{"name": "VC_TASK_INDEX", "value": "x"}, {"name": "VC_TASK_INDEX", "value": "y"}])
    response = (await bad_client.post("/mutate", json=admission_review(dup, uid="dup"))).json()["response"]
    # The effective (last) entry is corrected in place; nothing is duplicated further.
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "replace", "path": "/spec/containers/0/env/1/value", "value": "1"},
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "VK_TASK_INDEX", "value": "1"}},
    ]


@pytest.mark.parametrize(
    ("body", "status", "answer"),
    [
        (b"{not json", 400, {"error": "not an AdmissionReview: not JSON: key must be a string at line 1 column 2"}),
        (b'{"hello": "world"}', 400, {"error": "not an AdmissionReview: apiVersion: Field required"}),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"kind": {"kind": "Pod"}, "operation": "CREATE"}}',
         400, {"error": "not an AdmissionReview: request.uid: Field required"}),
        (b"[" * 100_000, 413, {"error": "body over the limit of 65536 bytes"}),
        (b"[" * 2000 + b"]" * 2000, 400, {"error": "not an AdmissionReview: not JSON: recursion limit exceeded at line 1 column 202"}),
    ],
)
async def test_envelope_errors(bad_client, body, status, answer):
    reply = await bad_client.post("/mutate", content=body, headers={"content-type": "application/json"})
    assert (reply.status_code, reply.json()) == (status, answer)


@pytest.mark.parametrize(
    ("obj", "message"),
    [(None, "request.object: missing or not a Pod"), ({"kind": "Service", "metadata": {}}, "request.object: missing or not a Pod")],
)
async def test_object_missing_or_not_a_pod(bad_client, obj, message):
    review = admission_review(pod("dup-env", "worker", 0), uid="obj")
    review["request"]["object"] = obj
    response = (await bad_client.post("/mutate", json=review)).json()["response"]
    assert response == denied("obj", message, code=400)


def nested(depth: int) -> dict:
    """``{"a": {"a": ... "x"}}``: ``depth`` objects deep."""
    value: object = "x"
    for _ in range(depth):
        value = {"a": value}
    return value  # type: ignore[return-value]


@pytest.mark.parametrize("depth", [101, 150, 600, 1000])
async def test_a_pod_nested_too_deep_is_refused_with_400(bad_client, depth):
    deep = pod("dup-env", "worker", 0)
    deep["spec"]["containers"][0]["x-deep"] = "DEEP"
    body = orjson.dumps(admission_review(deep, uid="deep")).replace(b'"DEEP"', b'{"a":' * depth + b'"x"' + b"}" * depth)
    reply = await bad_client.post("/mutate", content=body, headers={"content-type": "application/json"})
    if depth > 190:  # past what the JSON reader nests (200 levels, the envelope's included): refused unread
        assert reply.status_code == 400 and reply.json()["error"].startswith("not an AdmissionReview: not JSON: recursion limit exceeded")
    else:
        assert reply.json()["response"] == denied("deep", "request.object: nested more than 100 levels deep", code=400)


async def test_a_pod_just_under_the_depth_limit_is_wired(bad_client):
    ok = pod("dup-env", "worker", 0)
    ok["spec"]["containers"][0]["x-deep"] = nested(90)
    response = (await bad_client.post("/mutate", content=orjson.dumps(admission_review(ok, uid="ok")),
                                      headers={"content-type": "application/json"})).json()["response"]
    assert response["allowed"] and "patch" in response


async def test_a_job_nested_too_deep_is_refused_at_validate_and_its_pods_denied(bad_client, jobs_dir):
    deep = job("deep-job", {"env": []}, [("worker", 2)])
    # The builder's job, broken: its first task's Pod template metadata nested 150 levels deep.
    deep["spec"]["tasks"][0]["template"]["metadata"] = {"annotations": {"x": "y"}, "x-deep": nested(150)}
    review = admission_review(deep, uid="deep-job")
    response = (await bad_client.post("/validate", content=orjson.dumps(review), headers={"content-type": "application/json"})).json()
    assert response["response"] == denied("deep-job", "request.object: nested more than 100 levels deep", code=400)
    # A job that deep from a source (here a JSON file; the YAML loader refuses such files outright).
    from volcano_job_webhook.plugins import Chain, PluginError
    from volcano_job_webhook.server.handlers import JobCache

    with pytest.raises(PluginError, match="job default/deep-job: job: nested more than 100 levels deep"):
        JobCache(Chain()).prepared(deep)


async def test_a_job_of_a_billion_replicas_is_answered_at_once(bad_client, jobs_dir):
    """The plugins size host lists from the replica counts before building them (plugins/budget.py):
    through the server too, such a job is refused by svc, not built."""
    giant = job("giant", {"mpi": []}, [("master", 1), ("worker", 10**9)])
    response = (await bad_client.post("/validate", json=admission_review(giant, uid="giant"))).json()["response"]
    assert response["allowed"] is False and response["status"]["message"].startswith("job default/giant: plugin svc: ")
    (jobs_dir / "giant.json").write_text(json.dumps(giant))
    mutated = (await bad_client.post("/mutate", json=admission_review(pod("giant", "master", 0), uid="giant"))).json()["response"]
    assert mutated["status"] == response["status"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["spec"].__setitem__("containers", "x"), "request.object.spec.containers: must be a list of objects"),
        (lambda p: p["spec"]["containers"][0].__setitem__("env", {"a": 1}), "request.object.spec.containers[0].env: must be a list"),
        (lambda p: p["spec"]["containers"][0].__setitem__("env", ["E"]), "request.object.spec.containers[0].env[0]: must be an object"),
        (lambda p: p["spec"]["containers"][0].__setitem__("ports", [{"containerPort": "80"}]),
         "request.object.spec.containers[0].ports[0].containerPort: must be an integer"),
        (lambda p: p.__setitem__("spec", []), "request.object.spec: must be an object"),
        (lambda p: p["spec"].__setitem__("volumes", {"v": 1}), "request.object.spec.volumes: must be a list of objects"),
        (lambda p: p["spec"].__setitem__("hostname", 12), "request.object.spec.hostname: must be a string"),
        (lambda p: p["metadata"]["annotations"].__setitem__("volcano.sh/task-index", 5),
         "request.object.metadata.annotations: must be an object of strings"),
    ],
)
async def test_a_pod_whose_fields_have_the_wrong_types_is_refused_with_400(bad_client, change, message):
    """Fuzzing found such Pods answered "internal error" from deep inside a plugin."""
    broken = pod("dup-env", "worker", 0)
    change(broken)
    response = (await bad_client.post("/mutate", json=admission_review(broken, uid="t"))).json()["response"]
    assert response == denied("t", message, code=400)
