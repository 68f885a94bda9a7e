"""The reconciler's bookkeeping (reconciler/expectations.py, writer.py, workload.py) through a scripted API: a
store of objects whose answers a test can replace one at a time, and caches that hold an object only when
the test delivers its watch event. Each case is one a real cluster stages only by chance — a create that
meets an object the cache does not hold yet, a GET older than the cache, a job deleted and made again, a
reconcile that raises before writing, a version that never shows, a watch cut without 410 — so here each
is staged exactly, and what the reconciler does next is read off the calls it sends."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.helpers.clock import FakeClock
from tests.helpers.jobs import volcano_job
from volcano_job_webhook.kube import informer as informer_module
from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.kube.records import JobRecord, resource_version
from volcano_job_webhook.plugins import Chain
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, ObjectKey
from volcano_job_webhook.reconciler.events import EventRecorder
from volcano_job_webhook.reconciler.expectations import TIMEOUT, Expectations
from volcano_job_webhook.reconciler.metrics import ReconcilerMetrics
from volcano_job_webhook.reconciler.owned import OWNED, controlling
from volcano_job_webhook.reconciler.transforms import OwnedRecord
from volcano_job_webhook.reconciler.workload import WorkloadReconciler
from volcano_job_webhook.reconciler.writer import ObjectWriter

Ident = tuple[str, str]
NS = "ns"
KEY = ObjectKey(NS, "demo")
OLD_UID, NEW_UID = "00000000-0000-4000-8000-00000000000a", "00000000-0000-4000-8000-00000000000b"


class ScriptedApi:
    """The API server as a test scripts it: objects stored with a resourceVersion each, every call
    recorded as (verb, kind, name); :meth:`script` puts a one-off answer ahead of the store."""

    def __init__(self) -> None:
        self.store: dict[Ident, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str]] = []
        self._scripted: dict[tuple[str, str], list[Callable[[], Any]]] = {}
        self._rv = 100
        self._lock = threading.Lock()

    def script(self, verb: str, kind: str, answer: Callable[[], Any]) -> None:
        self._scripted.setdefault((verb, kind), []).append(answer)

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as another writer would: a new version (and a uid when it has none)."""
        with self._lock:
            self._rv += 1
            stored = copy.deepcopy(obj)
            stored["metadata"]["resourceVersion"] = str(self._rv)
            stored["metadata"].setdefault("uid", f"00000000-0000-4000-8000-{self._rv:012d}")
            self.store[(stored["kind"], stored["metadata"]["name"])] = stored
            return copy.deepcopy(stored)

    def _call(self, verb: str, kind: str, name: str) -> Callable[[], Any] | None:
        with self._lock:
            self.calls.append((verb, kind, name))
            queued = self._scripted.get((verb, kind))
            return queued.pop(0) if queued else None

    def sent(self, *verbs: str) -> list[tuple[str, str, str]]:
        return [c for c in self.calls if not verbs or c[0] in verbs]

    def create(self, resource: Any, namespace: str, obj: dict[str, Any], field_manager: str | None = None) -> dict[str, Any]:
        ident = (obj["kind"], obj["metadata"]["name"])
        if (scripted := self._call("create", *ident)) is not None:
            return scripted()  # type: ignore[no-any-return]
        if ident in self.store:
            raise ApiException(status=409, reason="AlreadyExists")
        return self.put(obj)

    def get(self, resource: Any, namespace: str, name: str) -> dict[str, Any] | None:
        if (scripted := self._call("get", resource.kind, name)) is not None:
            return scripted()  # type: ignore[no-any-return]
        found = self.store.get((resource.kind, name))
        return copy.deepcopy(found) if found else None

    def apply(self, resource: Any, obj: dict[str, Any], field_manager: str) -> dict[str, Any]:
        self._call("apply", obj["kind"], obj["metadata"]["name"])
        live = self.store.get((obj["kind"], obj["metadata"]["name"])) or {}
        return self.put({**live, **obj, "metadata": {**live.get("metadata", {}), **obj["metadata"]}})

    def merge_patch(self, resource: Any, namespace: str, name: str, patch: dict[str, Any], field_manager: str) -> dict[str, Any]:
        self._call("patch", resource.kind, name)
        return self.put(self.store[(resource.kind, name)])

    def delete(self, resource: Any, namespace: str, name: str, uid: str | None = None) -> Any:
        if (scripted := self._call("delete", resource.kind, name)) is not None:
            return scripted()
        return self.store.pop((resource.kind, name), None)


class Cache:
    """An informer's cache, holding what the test delivered."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], Any] = {}

    def get(self, namespace: str, name: str) -> Any:
        return self.records.get((namespace, name))

    def by_index(self, key: Any) -> list[Any]:
        return [r for r in self.records.values() if r.workload == key]


class Quiet:
    """Events go nowhere (EventRecorder's rest)."""

    def create(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


class World:
    """One WorkloadReconciler of Volcano Jobs on a scripted API, its caches fed only by :meth:`deliver`."""

    def __init__(self, chain: Any = None, clock: FakeClock | None = None) -> None:
        self.api = ScriptedApi()
        self.jobs = Cache()
        self.owned = {kind: Cache() for kind in OWNED}
        self.last: dict[Ident, dict[str, Any]] = {}  # each object as its last event showed it
        metrics = ReconcilerMetrics()
        events = EventRecorder(Quiet(), metrics)  # type: ignore[arg-type]
        self.writer = ObjectWriter(self.api, metrics, events, threads=4)  # type: ignore[arg-type]
        self.reconciler = WorkloadReconciler(VOLCANO_JOB, self.jobs, self.owned, chain or Chain(), self.writer, events, metrics)  # type: ignore[arg-type]
        self.clock = clock or FakeClock()
        self.reconciler.expectations = Expectations(clock=self.clock)

    def close(self) -> None:
        self.writer.close()

    def job(self, uid: str, plugins: dict[str, list[str]], **changes: Any) -> dict[str, Any]:
        """The Job ``demo`` in the API and in the cache (made again when ``uid`` is new)."""
        body = volcano_job("demo", namespace=NS, uid=uid, plugins={}, annotation=plugins, **changes)
        self.jobs.records[KEY] = JobRecord(self.api.put(body))
        return body

    def drop_job(self) -> None:
        self.jobs.records.pop(KEY, None)

    def deliver(self, kind: str, name: str) -> None:
        """The watch event of the stored ``kind``/``name``: the cache updated, then the reconciler told (a
        deleted Secret as the object it was, as the informer gives it)."""
        cache, key = self.owned[kind], (NS, name)
        stored = self.api.store.get((kind, name))
        if stored is not None:
            self.last[(kind, name)] = copy.deepcopy(stored)
            record = OwnedRecord(copy.deepcopy(stored))
            event = "MODIFIED" if key in cache.records else "ADDED"
            cache.records[key] = record
            self.reconciler.on_owned(kind, event, record, record.workload)
            return
        gone = cache.records.pop(key, None)
        if gone is not None:
            as_it_was = self.last.pop((kind, name))
            self.reconciler.on_owned(kind, "DELETED", as_it_was if kind == "Secret" else gone, gone.workload)

    def deliver_all(self) -> None:
        """Every event the watches owe: each stored object of ours, each cached one gone."""
        for kind, name in sorted({*self.api.store, *((k, n) for k, c in self.owned.items() for (_, n) in c.records)}):
            if kind in OWNED:
                self.deliver(kind, name)

    def reconcile(self) -> float | None:
        return self.reconciler.reconcile(KEY)

    def settle(self, rounds: int = 5) -> None:
        """Deliver what the watches owe and reconcile, until a reconcile sends nothing (a failure retried,
        as by the queue)."""
        for _ in range(rounds):
            self.deliver_all()
            before = len(self.api.calls)
            with contextlib.suppress(Exception):
                self.reconcile()  # what raises is retried, as the queue retries it
            if len(self.api.calls) == before:
                return
        raise AssertionError(f"still writing after {rounds} rounds: {self.api.calls[-8:]}")

    def ours(self) -> dict[Ident, str | None]:
        """Each stored side object and the uid of its controller."""
        return {ident: controlling(obj)[2] for ident, obj in self.api.store.items() if ident[0] in OWNED}


@pytest.fixture
def world() -> Iterator[World]:
    made = World()
    yield made
    made.close()


SVC = {"svc": []}
SIDE = {("ConfigMap", "demo-svc"), ("Service", "demo"), ("NetworkPolicy", "demo")}


def test_a_job_made_again_never_gets_a_create_for_what_the_same_round_deletes(world: World):
    """The predecessor's objects still cached (the reconciler was away, or the garbage collector slow):
    the round deletes them and creates nothing of those names — a create would meet the object being
    deleted (409) — and once their deletions are in the cache the new job's are made."""
    world.job(OLD_UID, SVC)
    world.settle()
    assert world.ours() == dict.fromkeys(SIDE, OLD_UID)
    world.job(NEW_UID, SVC)  # deleted and made again under its name
    world.api.calls.clear()
    with contextlib.suppress(Exception):
        world.reconcile()
    deleted = {(k, n) for v, k, n in world.api.sent("delete")}
    created = {(k, n) for v, k, n in world.api.sent("create")}
    assert deleted == SIDE
    assert not deleted & created, f"created in the round that deletes them: {sorted(deleted & created)}"
    world.settle()
    assert world.ours() == dict.fromkeys(SIDE, NEW_UID), "the new job's own objects"


def test_a_version_read_after_a_409_is_not_booked_as_ours(world: World):
    """A create answered 409 for an object the cache does not hold yet: the GET's version is someone
    else's, so once the cache holds it the object is compared with the desired one, and repaired."""
    world.job(OLD_UID, SVC)
    world.settle()
    # Another writer edits the ConfigMap; the cache has not seen it, and has lost the object (a relist under way).
    edited = copy.deepcopy(world.api.store[("ConfigMap", "demo-svc")])
    edited["data"] = {"hosts": "someone else's"}
    world.api.put(edited)
    world.owned["ConfigMap"].records.pop((NS, "demo-svc"))
    with pytest.raises(Exception, match="not yet in the cache"):
        world.reconcile()
    world.deliver("ConfigMap", "demo-svc")
    world.api.calls.clear()
    world.reconcile()
    assert ("apply", "ConfigMap", "demo-svc") in world.api.sent(), "the other writer's edit is repaired"


def test_a_get_older_than_the_cache_is_retried_not_waited_for(world: World):
    """Putting an SSH key back (the cache keeps it as a digest) reads the Secret; an answer older than the
    cache is not booked as ours (the cache would never show it again): the reconcile fails, and its retry
    reads again and applies."""
    world.job(OLD_UID, {"ssh": []})
    world.settle()
    older = copy.deepcopy(world.api.store[("Secret", "demo-ssh")])
    # Another writer gave the job new keys and spoiled its config; the cache has it.
    newer = copy.deepcopy(older)
    newer["data"] = {**older["data"], "id_rsa": "bmV3LWtleQ==" * 10, "config": "U3BvaWx0"}
    world.api.put(newer)
    world.deliver("Secret", "demo-ssh")
    world.api.script("get", "Secret", lambda: copy.deepcopy(older))
    world.api.calls.clear()
    with pytest.raises(Exception, match="not yet in the cache"):
        world.reconcile()
    world.reconcile()  # the queue's retry
    assert ("apply", "Secret", "demo-ssh") in world.api.sent(), "the retry applies on a fresh read"


class Failing:
    """A chain whose resources() raises ``times`` times first (a third-party plugin's bug)."""

    def __init__(self, times: int) -> None:
        self.chain, self.left = Chain(), times

    def resources(self, *args: Any, **kwargs: Any) -> Any:
        if self.left:
            self.left -= 1
            raise RuntimeError("a plugin's bug")
        return self.chain.resources(*args, **kwargs)


def test_a_reconcile_that_raises_before_writing_is_worked_out_again_not_skipped():
    world = World(chain=Failing(2))
    try:
        world.job(OLD_UID, SVC)
        with pytest.raises(RuntimeError):
            world.reconcile()
        with pytest.raises(RuntimeError):
            world.reconcile()  # the retry fails as the first did: not a silent success that resets the backoff
        world.reconcile()
        assert {(k, n) for _, k, n in world.api.sent("create")} == SIDE
    finally:
        world.close()


def test_a_version_that_never_shows_is_waited_for_with_a_requeue_then_given_up(world: World):
    world.job(OLD_UID, SVC)
    assert not world.reconcile()
    world.clock.advance(10)
    wait = world.reconcile()  # no event came: the cache is older than the writes
    assert wait == pytest.approx(TIMEOUT - 10), "the time left, as a requeue"
    assert len(world.api.sent("create")) == 3, "nothing sent while waiting"
    world.clock.advance(TIMEOUT)
    world.api.calls.clear()
    with contextlib.suppress(Exception):
        world.reconcile()  # the deadline passed: worked out on the cache as it is (its creates meet 409s)
    assert world.api.sent("create"), "the job was worked out again"


def test_a_delete_held_by_a_finalizer_is_met_by_its_terminating_version(world: World):
    """Our delete of an object with a finalizer answers the object, terminating: the cache shows that
    version, not its absence, and the job's next change is not held up waiting for an absence."""
    world.job(OLD_UID, SVC)
    world.settle()
    held = world.api.store[("ConfigMap", "demo-svc")]
    held["metadata"]["finalizers"] = ["example.com/hold"]

    def terminating() -> dict[str, Any]:
        obj = copy.deepcopy(held)
        obj["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
        return world.api.put(obj)
    world.api.script("delete", "ConfigMap", terminating)
    world.job(OLD_UID, {})  # svc no longer wanted
    world.reconcile()
    world.deliver_all()
    world.job(OLD_UID, {"ssh": []})
    world.api.calls.clear()
    world.reconcile()
    assert ("create", "Secret", "demo-ssh") in world.api.sent(), "the job's next change is worked out at once"


def test_nothing_of_a_deleted_job_stays_in_the_reconciler(world: World):
    """Its objects deleted and their events in: no Secret (private key included), no expectation, no entry."""
    world.job(OLD_UID, {"ssh": [], **SVC})
    world.settle()
    world.drop_job()
    world.settle()
    assert world.ours() == {}
    assert not world.reconciler._deleted, "a deleted job's Secret is kept"
    assert len(world.reconciler.expectations) == 0


def test_a_deleted_secret_of_a_running_job_comes_back_with_its_keys(world: World):
    """What the memory of deleted Secrets is for: the job's Pods mount the keys with subPath, which
    a new Secret would not reach, so the Secret comes back as it was."""
    world.job(OLD_UID, {"ssh": []})
    world.settle()
    keys = world.api.store[("Secret", "demo-ssh")]["data"]["id_rsa"]
    del world.api.store[("Secret", "demo-ssh")]
    world.deliver("Secret", "demo-ssh")
    world.settle()
    assert world.api.store[("Secret", "demo-ssh")]["data"]["id_rsa"] == keys
    assert not world.reconciler._deleted, "kept only until made again"


# The reflector: a watch cut resumes where it was ----------------------------------------------------


class ScriptedWatches:
    """An informer's API: one list, then each watch's events from ``watches`` (an exception ends one)."""

    def __init__(self, watches: list[list[Any]]) -> None:
        self.watches = watches
        self.lists = 0
        self.watched: list[str] = []
        self.done = threading.Event()
        self.final: tuple[int, list[str]] = (0, [])  # the lists and watches when the script ran out

    def call(self, method: str, path: str, *, query: Any = (), timeout: Any = None, **kwargs: Any) -> dict[str, Any]:
        self.lists += 1
        return {"metadata": {"resourceVersion": "10"}, "items": [
            {"metadata": {"name": "a", "namespace": NS, "uid": "u-a", "resourceVersion": "9"}}]}

    def watch(self, path: str, query: Any, timeout: float) -> Any:
        self.watched.append(dict(query)["resourceVersion"])
        if not self.watches:
            if not self.done.is_set():
                self.final = (self.lists, list(self.watched))
                self.done.set()
            raise urllib3.exceptions.ProtocolError("no more")
        return _Stream(self.watches.pop(0))


class _Stream:
    def __init__(self, events: list[Any]) -> None:
        self.events = events

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for event in self.events:
            if isinstance(event, Exception):
                raise event
            yield event

    def cancel(self) -> None:
        pass


def modified(name: str, rv: str) -> dict[str, Any]:
    return {"type": "MODIFIED", "object": {"metadata": {"name": name, "namespace": NS, "uid": f"u-{name}", "resourceVersion": rv}}}


class Plain:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.key, self.version = ObjectKey(NS, obj["metadata"]["name"]), resource_version(obj)


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(informer_module, "delay", lambda *args: 0.0)


def run_informer(api: ScriptedWatches) -> Informer[Any]:
    informer: Informer[Any] = Informer(client.ApiClient(), VOLCANO_JOB, [NS], transform=Plain)  # type: ignore[arg-type]
    informer.rest = api  # type: ignore[assignment]
    informer.start()
    assert api.done.wait(5), f"the scripted watches were not all asked for: {api.watched}"
    informer.stop()
    return informer


@pytest.mark.usefixtures("no_backoff")
def test_a_watch_cut_without_410_resumes_at_its_last_version_without_a_list():
    cut = urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead")
    api = ScriptedWatches([[modified("a", "11"), cut], [ApiException(status=500)], [modified("a", "12")]])
    informer = run_informer(api)
    lists, watched = api.final
    assert lists == 1, "a watch cut costs no LIST"
    assert watched == ["10", "11", "11", "12"], "each watch resumes at the last version seen"
    assert informer.get(NS, "a").version == 12


@pytest.mark.usefixtures("no_backoff")
def test_a_watch_answered_410_lists_again():
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    api = ScriptedWatches([[modified("a", "11"), gone]])
    run_informer(api)
    assert api.final == (2, ["10", "10"]), "a fresh list, watched from its version"
