"""The webhook on ``--job-source kube``: the watch-backed cache, a live GET on a miss, and answering
from the cache while the API server is away. Why the API double: the API server away and back on
cue, and its request log counting the live GETs (fault injection)."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import types
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from kubernetes import client

from tests.helpers.apiserver import FakeApiServer
from tests.helpers.envtest import eventually
from tests.helpers.jobs import example_job
from volcano_job_webhook.plugins import Chain, Job
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.server.admission import admission_review
from volcano_job_webhook.server.app import create_app
from volcano_job_webhook.server.jobs import kube as jobs_kube
from volcano_job_webhook.server.jobs.kube import KubeJobSource

pytestmark = pytest.mark.anyio


@pytest.fixture
async def setup() -> AsyncIterator[tuple[FakeApiServer, httpx.AsyncClient, KubeJobSource]]:
    with FakeApiServer() as server:
        jobs = client.CustomObjectsApi(server.api_client())
        jobs.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", example_job("pytorch"))
        source = KubeJobSource(server.api_client())
        app = create_app(source, Chain())
        async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://t") as c:
            yield server, c, source


def review_for(server: FakeApiServer, name: str, task: str, index: int) -> dict:
    stored = server.get_object("jobs.batch.volcano.sh", name, "default")
    pod = make_pod(Job.from_object(stored), task, index)
    return admission_review(pod, uid=f"{name}-{task}-{index}")


async def test_cached_jobs_are_answered_and_readiness_follows_the_sync(setup):
    server, c, source = setup
    await eventually(lambda: source.ready, 10, "the source ready")
    ready = (await c.get("/readyz")).json()
    assert ready == {"status": "ready", "jobs": 1, "source": "kube", "apiServer": "reachable"}
    answer = (await c.post("/mutate", json=review_for(server, "pytorch-demo", "worker", 0))).json()["response"]
    assert answer["allowed"] and answer["patchType"] == "JSONPatch"


async def test_a_miss_costs_one_live_get(setup):
    server, c, source = setup
    await eventually(lambda: source.ready, 10, "the source ready")
    source.informer.stop()  # no watch events from now on: only a live GET can find the new job
    client.CustomObjectsApi(server.api_client()).create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", example_job("ray"))
    server.clear_requests()
    answer = (await c.post("/mutate", json=review_for(server, "ray-demo", "worker", 0))).json()["response"]
    assert answer["allowed"] and "patch" in answer
    gets = [r for r in server.requests if r.verb == "get" and r.resource == "jobs"]
    assert len(gets) == 1
    server.clear_requests()
    await c.post("/mutate", json=review_for(server, "ray-demo", "worker", 1))
    assert not [r for r in server.requests if r.resource == "jobs"], "the fetched job is cached"


async def test_answers_from_cache_while_the_api_server_is_away(setup):
    server, c, source = setup
    await eventually(lambda: source.ready, 10, "the source ready")
    review = review_for(server, "pytorch-demo", "master", 0)
    server.stop()
    await eventually(lambda: not source.informer.connected, 10, "the informer disconnected")
    ready = await c.get("/readyz")
    assert ready.status_code == 200 and ready.json()["apiServer"] == "unreachable"
    answer = (await c.post("/mutate", json=review)).json()["response"]
    assert answer["allowed"] and "patch" in answer
    # An unknown job cannot be fetched now.
    other = copy.deepcopy(review)
    other["request"]["object"]["metadata"]["labels"]["volcano.sh/job-name"] = "elsewhere"
    missing = (await c.post("/mutate", json=other)).json()["response"]
    # Never let through unwired: an error, so the failure policy applies and Volcano's controller
    # creates the Pod again.
    assert not missing["allowed"] and missing["status"]["code"] == 500
    assert missing["status"]["message"].startswith("volcano-job-webhook: could not look up job default/elsewhere (")
    server.restart()
    await eventually(lambda: source.informer.connected, 30, "the informer reconnected")
    assert (await c.get("/readyz")).json()["apiServer"] == "reachable"
    assert "patch" in (await c.post("/mutate", json=review)).json()["response"]


def create(server: FakeApiServer, plugin: str, namespace: str = "default") -> dict:
    """The example job of ``plugin`` (``<plugin>-demo``) in ``namespace``."""
    obj = example_job(plugin, namespace)
    return client.CustomObjectsApi(server.api_client()).create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", namespace, "jobs", obj)


def job_gets(server: FakeApiServer) -> list:
    return [r for r in server.requests if r.verb == "get" and r.resource == "jobs"]


@asynccontextmanager
async def serving(source: KubeJobSource) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(source, Chain())
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://t") as c:
        await eventually(lambda: source.ready, 10, "the source ready")
        yield c


async def test_only_watched_namespaces_are_served(tmp_path):
    with FakeApiServer() as server:
        mine = create(server, "pytorch", "team-a")
        stored = create(server, "pytorch", "team-b")
        source = KubeJobSource(server.api_client(), ["team-a"])
        async with serving(source) as c:
            server.clear_requests()
            pod = make_pod(Job.from_object(stored), "worker", 0)
            answer = (await c.post("/mutate", json=admission_review(pod, uid="b"))).json()["response"]
            assert answer["allowed"] and "patch" not in answer
            assert answer["warnings"] == ["volcano-job-webhook: namespace team-b is not watched by this webhook (--namespace): "
                                          "Pod of job pytorch-demo not wired"]
            assert job_gets(server) == [], "nothing is asked about a namespace we do not watch"
            wired = (await c.post("/mutate", json=admission_review(make_pod(Job.from_object(mine), "worker", 0), uid="a")))
            assert "patch" in wired.json()["response"]


def without_owner(review: dict) -> dict:
    review["request"]["object"]["metadata"].pop("ownerReferences", None)
    return review


async def test_misses_are_cached_briefly_only_for_pods_without_an_owner_and_concurrent_lookups_share_one_get():
    with FakeApiServer() as server:
        create(server, "pytorch")
        source = KubeJobSource(server.api_client(), not_found_ttl=30)
        async with serving(source) as c:
            template = review_for(server, "pytorch-demo", "worker", 0)
            owned, ownerless = [], []
            for i in range(50):  # 50 Pods naming 5 jobs that do not exist
                review = copy.deepcopy(template)
                review["request"]["uid"] = f"u{i}"
                review["request"]["object"]["metadata"]["labels"]["volcano.sh/job-name"] = f"missing-{i % 5}"
                owned.append(review)
                ownerless.append(without_owner(copy.deepcopy(review)))
            for reviews in (ownerless, owned):
                server.clear_requests()
                answers = [a.json()["response"] for a in await asyncio.gather(*(c.post("/mutate", json=r) for r in reviews))]
                assert all(a["allowed"] and "patch" not in a for a in answers)
                assert len(job_gets(server)) == 5, "one GET per job, however many Pods ask at once"
            server.clear_requests()
            await asyncio.gather(*(c.post("/mutate", json=r) for r in ownerless))
            assert job_gets(server) == [], "a miss is remembered for Pods that name no owner"
            await asyncio.gather(*(c.post("/mutate", json=r) for r in owned))
            assert len(job_gets(server)) == 5, "a Pod's owner exists, or did a moment ago: its Job is always asked for"


async def test_a_pod_of_a_job_created_again_under_the_same_name_is_wired_from_the_new_job():
    """The informer still holds the old Job (its watch is stopped here, as a watch can lag): the
    Pod's owner uid is not the held Job's, so the API server is asked, and the new Job wires it."""
    with FakeApiServer() as server:
        old = create(server, "pytorch")
        source = KubeJobSource(server.api_client())
        async with serving(source) as c:
            source.informer.stop()
            jobs = client.CustomObjectsApi(server.api_client())
            jobs.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", "pytorch-demo")
            renewed = example_job("pytorch")
            renewed["spec"]["plugins"]["pytorch"] = ["--port=31000"]
            new = jobs.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", renewed)
            assert source.informer.get("default", "pytorch-demo").uid == old["metadata"]["uid"]
            server.clear_requests()
            pod = make_pod(Job.from_object(new), "worker", 0)
            answer = (await c.post("/mutate", json=admission_review(pod, uid="new"))).json()["response"]
            assert len(job_gets(server)) == 1
            patch = json.loads(base64.b64decode(answer["patch"]))
            assert {"name": "MASTER_PORT", "value": "31000"} in next(op["value"] for op in patch if op["path"].endswith("/env"))
            # A Pod whose owner is neither (a Job of that name deleted before we ever saw it) is not
            # wired from the Job that has the name now.
            stale = make_pod(Job.from_object(old), "worker", 1)
            stale["metadata"]["ownerReferences"][0]["uid"] = "00000000-0000-4000-8000-00000000dead"
            gone = (await c.post("/mutate", json=admission_review(stale, uid="old"))).json()["response"]
            assert gone["allowed"] and "patch" not in gone
            assert "is not the Pod's owner" in gone["warnings"][0]


async def test_a_fetched_job_is_forgotten_after_the_ttl_and_never_enters_the_informer(monkeypatch):
    now = 1000.0
    clock = types.SimpleNamespace(monotonic=lambda: now)  # the TTL's clock, moved by the test alone
    monkeypatch.setattr(jobs_kube, "time", clock)
    with FakeApiServer() as server:
        source = KubeJobSource(server.api_client(), lookup_ttl=60)
        async with serving(source) as c:
            source.informer.stop()  # no watch from now on: only live GETs see the cluster
            stored = create(server, "ray")
            review = review_for(server, "ray-demo", "worker", 0)
            assert "patch" in (await c.post("/mutate", json=review)).json()["response"]
            assert source.informer.get("default", "ray-demo") is None, "a live GET's answer stays out of the informer"
            client.CustomObjectsApi(server.api_client()).delete_namespaced_custom_object(
                "batch.volcano.sh", "v1alpha1", "default", "jobs", stored["metadata"]["name"])
            now += 59
            assert "patch" in (await c.post("/mutate", json=review)).json()["response"], "reused within the TTL"
            now += 1
            gone = (await c.post("/mutate", json=review)).json()["response"]
            assert "patch" not in gone and gone["warnings"][0].endswith("not found: Pod not wired by its plugins")
            assert len(job_gets(server)) == 2, "two live GETs: the first, and the one after the TTL"


async def test_the_fetched_cache_is_bounded():
    with FakeApiServer() as server:
        source = KubeJobSource(server.api_client(), lookup_ttl=60, max_fetched=10)
        async with serving(source):
            for i in range(25):
                assert await source.get("default", f"nope-{i}") is None
            assert len(source._fetched) == 10
