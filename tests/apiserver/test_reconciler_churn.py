"""The reconciler when users delete, re-create and restart things, on a real kube-apiserver (tests/helpers/envtest.py),
running as the manifests' ServiceAccount. Each case is looped in one test: the races it is about (the
predecessor's objects deleted while the new job's are made, by us or by the garbage collector) come out
differently on each round, and one wrong round is a failure. The bookkeeping behind it, staged exactly:
tests/unit/reconciler/test_reconciler_bookkeeping.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apiserver.test_reconciler import objects
from tests.helpers.envtest import JOB_API_VERSION, EnvTest, controller_manager, create, delete, read, wait_until
from tests.helpers.jobs import volcano_job
from volcano_job_webhook.plugins.builtin.ssh import generate_key_pair
from volcano_job_webhook.reconciler import Reconciler

ROUNDS = 30
# What the job below wants: svc's ConfigMap, Service and NetworkPolicy, ssh's Secret.
SIDE = {("ConfigMap", "churn-svc"), ("Service", "churn"), ("NetworkPolicy", "churn"), ("Secret", "churn-ssh")}


def churn_job(namespace: str, name: str = "churn", ssh: list[str] | None = None) -> dict[str, Any]:
    return volcano_job(name, namespace=namespace, plugins={}, annotation={"svc": [], "ssh": ssh or []})


def owned_by(admin: Any, namespace: str, uid: str) -> bool:
    """Every object the job wants is there, each with the job of ``uid`` as its one owner."""
    live = objects(admin, namespace)
    return set(live) == SIDE and all([r["uid"] for r in o["metadata"]["ownerReferences"]] == [uid] for o in live.values())


def made_again(admin: Any, namespace: str, between: Callable[[], None] = lambda: None) -> tuple[str, str]:
    """The job deleted, ``between()`` run, the job made again under its name: (old uid, new uid)."""
    old = read(admin, JOB_API_VERSION, "Job", "churn", namespace)
    assert old is not None
    delete(admin, JOB_API_VERSION, "Job", "churn", namespace)
    wait_until(lambda: read(admin, JOB_API_VERSION, "Job", "churn", namespace) is None, 5, "the Job gone")
    between()
    new = create(admin, churn_job(namespace))
    return old["metadata"]["uid"], new["metadata"]["uid"]


def within(seconds: float, admin: Any, namespace: str, uid: str, since: float, what: str) -> float:
    """Wait until the job of ``uid`` owns its objects; fail past ``seconds`` from ``since``. Returns the time taken."""
    wait_until(lambda: owned_by(admin, namespace, uid), seconds + 5, what, interval=0.02)
    took = time.monotonic() - since
    assert took <= seconds, f"{what}: {took:.1f} s, over {seconds} s"
    return took


@pytest.fixture
def running(envtest: EnvTest, kube_admin: Any, kube_namespace: str,
            start_reconciler: Callable[..., Reconciler]) -> Iterator[tuple[Any, str, Callable[..., Reconciler]]]:
    created = create(kube_admin, churn_job(kube_namespace))
    reconciler = start_reconciler(kube_namespace)
    within(10, kube_admin, kube_namespace, created["metadata"]["uid"], time.monotonic(), "the first job's objects")
    yield kube_admin, kube_namespace, start_reconciler
    reconciler.stop()


def test_a_job_made_again_gets_its_own_objects_with_the_reconciler_running(running: tuple[Any, str, Any]):
    admin, namespace, _ = running
    for round_ in range(ROUNDS):
        started = time.monotonic()
        _, uid = made_again(admin, namespace)
        within(5, admin, namespace, uid, started, f"round {round_}: the new job's own objects")


def test_a_job_made_again_while_the_reconciler_was_stopped_gets_its_own_objects(envtest: EnvTest, kube_admin: Any,
                                                                                kube_namespace: str,
                                                                                start_reconciler: Callable[..., Reconciler]):
    created = create(kube_admin, churn_job(kube_namespace))
    reconciler = start_reconciler(kube_namespace)
    within(10, kube_admin, kube_namespace, created["metadata"]["uid"], time.monotonic(), "the first job's objects")
    for round_ in range(ROUNDS):
        _, uid = made_again(kube_admin, kube_namespace, between=reconciler.stop)
        started = time.monotonic()
        reconciler = start_reconciler(kube_namespace)
        within(5, kube_admin, kube_namespace, uid, started, f"round {round_}: the new job's own objects after a restart")
        reconciler.stop()


def test_a_job_made_again_gets_its_own_objects_beside_the_garbage_collector(envtest: EnvTest, running: tuple[Any, str, Any],
                                                                           tmp_path: Path):
    """kube-controller-manager's garbage collector deletes the predecessor's objects too, racing our deletes."""
    admin, namespace, _ = running
    with controller_manager(envtest, tmp_path, controllers=("garbage-collector-controller",)):
        for round_ in range(ROUNDS):
            started = time.monotonic()
            _, uid = made_again(admin, namespace)
            within(5, admin, namespace, uid, started, f"round {round_}: the new job's own objects beside the collector")


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc to read this process's memory")
def test_nothing_of_a_thousand_deleted_ssh_jobs_stays_in_the_reconciler(kube_admin: Any, kube_namespace: str,
                                                                        start_reconciler: Callable[..., Reconciler]):
    """Each ssh job's Secret holds its private key: once the jobs are deleted and their objects gone, the
    reconciler keeps no entry, Secret or expectation of any, and its memory does not grow with them."""
    keys = generate_key_pair()  # given, as a batch of jobs may (the plugin's --ssh-private-key): one key, not a thousand
    ssh = [f"--ssh-private-key={keys.private_pem.decode()}", f"--ssh-public-key={keys.public_openssh.decode()}"]
    reconciler = start_reconciler(kube_namespace)
    (jobs,) = [c for c in reconciler.manager.controllers if c.name == "jobs.batch.volcano.sh"]
    job_reconciler = jobs.reconcile.__self__  # type: ignore[attr-defined]

    def batch(first: int, count: int) -> None:
        names = [f"ssh-{i}" for i in range(first, first + count)]
        for name in names:
            create(kube_admin, volcano_job(name, namespace=kube_namespace, plugins={}, annotation={"ssh": ssh}))
        wait_until(lambda: len([k for k, _ in objects(kube_admin, kube_namespace) if k == "Secret"]) == count, 60,
                   f"{count} Secrets", interval=0.2)
        for name in names:
            delete(kube_admin, JOB_API_VERSION, "Job", name, kube_namespace)
        wait_until(lambda: not objects(kube_admin, kube_namespace), 60, "every Secret deleted", interval=0.2)
        wait_until(lambda: len(jobs.queue) == 0 and not jobs.queue._processing, 60, "the queue drained", interval=0.1)

    batch(0, 100)
    after_first = rss_kib()
    for first in range(100, 1000, 300):
        batch(first, 300)
    grown = (rss_kib() - after_first) / 1024
    assert not job_reconciler._deleted, f"deleted jobs' Secrets kept: {list(job_reconciler._deleted)[:5]}"
    assert len(job_reconciler.expectations) == 0, "expectations of deleted jobs"
    assert not job_reconciler.events._said, "what was said of deleted jobs"
    assert not jobs.queue._failures, "backoffs of deleted jobs"
    assert grown <= 10, f"memory grew {grown:.1f} MB between the first 100 jobs and the 1,000th"
    print(f"RSS grew {grown:.1f} MB from the first 100 jobs to 1,000 (pid {os.getpid()})")
