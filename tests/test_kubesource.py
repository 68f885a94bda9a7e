"""The webhook on ``--job-source kube``: the watch-backed cache, a live GET on a miss, and answering
from the cache while the API server is away."""

from __future__ import annotations

import copy
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import yaml
from kubernetes import client

from volcano_job_webhook.plugins import Chain
from tests.apiserver import FakeApiServer
from tests.conftest import EXAMPLES
from volcano_job_webhook.server.review import admission_review
from volcano_job_webhook.server.app import create_app
from volcano_job_webhook.server.jobs.kube import KubeJobSource
from volcano_job_webhook.plugins.podgen import make_pod
from volcano_job_webhook.plugins import Job

pytestmark = pytest.mark.anyio


def job(name: str) -> dict:
    obj = yaml.safe_load((EXAMPLES / "jobs" / f"{name}-job.yaml").read_text())
    obj["metadata"].pop("uid")
    return obj


async def wait_for(predicate, timeout: float = 10.0) -> None:
    import anyio

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await anyio.sleep(0.05)


@pytest.fixture
async def setup() -> AsyncIterator[tuple[FakeApiServer, httpx.AsyncClient, KubeJobSource]]:
    with FakeApiServer() as server:
        jobs = client.CustomObjectsApi(server.api_client())
        jobs.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", job("pytorch"))
        source = KubeJobSource(server.api_client())
        app = create_app(source, Chain())
        async with app.lifespan():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="https://t") as c:
                yield server, c, source


def review_for(server: FakeApiServer, name: str, task: str, index: int) -> dict:
    stored = server.get_object("jobs.batch.volcano.sh", name, "default")
    pod = make_pod(Job.from_object(stored), task, index)
    return admission_review(pod, uid=f"{name}-{task}-{index}")


async def test_cached_jobs_are_answered_and_readiness_follows_the_sync(setup):
    server, c, source = setup
    await wait_for(lambda: source.ready)
    ready = (await c.get("/readyz")).json()
    assert ready == {"status": "ready", "jobs": 1, "source": "kube", "apiServer": "reachable"}
    answer = (await c.post("/mutate", json=review_for(server, "pytorch-demo", "worker", 0))).json()["response"]
    assert answer["allowed"] and answer["patchType"] == "JSONPatch"


async def test_a_miss_costs_one_live_get(setup):
    server, c, source = setup
    await wait_for(lambda: source.ready)
    source.informer.stop()  # no watch events from now on: only a live GET can find the new job
    client.CustomObjectsApi(server.api_client()).create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "default", "jobs", job("ray"))
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
    await wait_for(lambda: source.ready)
    review = review_for(server, "pytorch-demo", "master", 0)
    server.stop()
    await wait_for(lambda: not source.informer.connected)
    ready = await c.get("/readyz")
    assert ready.status_code == 200 and ready.json()["apiServer"] == "unreachable"
    answer = (await c.post("/mutate", json=review)).json()["response"]
    assert answer["allowed"] and "patch" in answer
    # An unknown job cannot be fetched now: allowed, unchanged, with a warning.
    other = copy.deepcopy(review)
    other["request"]["object"]["metadata"]["labels"]["volcano.sh/job-name"] = "elsewhere"
    missing = (await c.post("/mutate", json=other)).json()["response"]
    assert missing["allowed"] and "patch" not in missing
    assert missing["warnings"][0].startswith("volcano-job-webhook: could not look up job default/elsewhere")
    server.restart()
    await wait_for(lambda: source.informer.connected, timeout=30)
    assert (await c.get("/readyz")).json()["apiServer"] == "reachable"
