"""The reconciler's controller-runtime shape (webhook/reconciler/manager.py), without an API server:
one cache per kind shared by every controller, an owned object's event routed only to the
controller for the kind of its controller reference, and a resync that queues each controller's
own keys."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from tests.helpers.jobs import volcano_job
from volcano_job_webhook.kube.informer import LISTED
from volcano_job_webhook.kube.records import JobRecord
from volcano_job_webhook.plugins.kinds import BATCH_JOB, CONFIG_MAP, JOBSET, SECRET, VOLCANO_JOB, Kind, ObjectKey
from volcano_job_webhook.reconciler.manager import Manager, build
from volcano_job_webhook.reconciler.owned import OWNED
from volcano_job_webhook.reconciler.transforms import OwnedRecord


def owned_by(kind: Kind, owner: str, name: str, what: Kind = CONFIG_MAP) -> dict[str, Any]:
    ref = {"apiVersion": kind.api_version, "kind": kind.kind, "name": owner, "uid": f"uid-{owner}", "controller": True}
    return {"apiVersion": what.api_version, "kind": what.kind,
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": "1", "ownerReferences": [ref]}}


def built(manager: Manager, for_: Kind, **options: Any) -> Any:
    return build(manager, for_=for_, owns=OWNED.values(), reconcile=lambda key: None, resync_seconds=3600, workers=1, **options)


def drained(queue: Any) -> list[ObjectKey]:
    keys = []
    while (key := queue.get(timeout=0)) is not None:
        keys.append(key)
        queue.done(key)
    return keys


def test_owned_events_go_only_to_the_controller_for_the_owners_kind():
    manager = Manager(client.ApiClient())
    observed: list[tuple[str, str, ObjectKey]] = []
    volcano = built(manager, VOLCANO_JOB, observe=lambda kind, event, obj, owner: observed.append((kind, event, owner)))
    batch = built(manager, BATCH_JOB)
    configmaps = manager.cache(CONFIG_MAP)
    assert volcano.caches[1] is configmaps and batch.caches[1] is configmaps, "one cache of each owned kind, shared"
    assert len(manager.caches) == 2 + len(OWNED)

    configmaps._emit("ADDED", OwnedRecord(owned_by(BATCH_JOB, "a", "a-svc")))
    configmaps._emit("MODIFIED", OwnedRecord(owned_by(VOLCANO_JOB, "a", "a-hosts")))
    configmaps._emit("ADDED", OwnedRecord(owned_by(JOBSET, "js", "js-svc")))  # no controller for JobSets: dropped
    manager.cache(SECRET)._emit("DELETED", owned_by(VOLCANO_JOB, "v", "v-ssh", SECRET))  # a deleted Secret, as it was
    assert drained(batch.queue) == [ObjectKey("ml", "a")]
    assert drained(volcano.queue) == [ObjectKey("ml", "a"), ObjectKey("ml", "v")]
    assert observed == [("ConfigMap", "MODIFIED", ("ml", "a")), ("Secret", "DELETED", ("ml", "v"))], "only its own kind's"


def test_a_resync_queues_each_controllers_own_jobs_and_owners():
    manager = Manager(client.ApiClient())
    volcano = built(manager, VOLCANO_JOB)
    batch = built(manager, BATCH_JOB)
    manager.cache(VOLCANO_JOB)._put(JobRecord(volcano_job("train", namespace="ml", uid="u")))
    for record in (OwnedRecord(owned_by(VOLCANO_JOB, "train", "train-svc")), OwnedRecord(owned_by(VOLCANO_JOB, "gone", "gone-svc")),
                   OwnedRecord(owned_by(BATCH_JOB, "idx", "idx-svc"))):
        manager.cache(CONFIG_MAP)._put(record)
    assert manager.owners(VOLCANO_JOB) == {ObjectKey("ml", "train"), ObjectKey("ml", "gone")}
    assert sum(c.resync() for c in manager.controllers) == 3
    assert sorted(drained(volcano.queue)) == [("ml", "gone"), ("ml", "train")], "a job deleted unseen leaves its objects"
    assert drained(batch.queue) == [ObjectKey("ml", "idx")]


def test_the_first_list_waits_behind_a_change():
    """What the first list finds is queued at low priority (a resync's), watch events at high: a job
    created while a hundred thousand listed ones wait is reconciled next."""
    manager = Manager(client.ApiClient())
    controller = built(manager, VOLCANO_JOB)
    jobs = manager.cache(VOLCANO_JOB)
    for i in range(1000):
        jobs._emit(LISTED, JobRecord(volcano_job(f"listed-{i}")))
    jobs._emit("ADDED", JobRecord(volcano_job("new")))
    assert controller.queue.get(timeout=0) == ObjectKey("default", "new")
    assert controller.queue.get(timeout=0) == ObjectKey("default", "listed-0")


def test_a_controller_owns_only_owned_kinds_and_is_built_once_per_kind():
    manager = Manager(client.ApiClient())
    with pytest.raises(ValueError, match=r"jobs\.batch is not a kind of side object"):
        build(manager, for_=VOLCANO_JOB, owns=[BATCH_JOB], reconcile=lambda key: None, resync_seconds=1, workers=1)
    built(manager, VOLCANO_JOB)
    with pytest.raises(ValueError, match="built already"):
        built(manager, VOLCANO_JOB)
