"""``volcano-webhook reconcile``: make the cluster hold each job's side objects, exactly.

For every Volcano Job the plugin chain says which objects the job needs (``Chain.resources``); the
reconciler creates the missing ones, repairs drifted ones, and deletes the ones this project made
that the job no longer asks for — all of them when the job is gone (owner references are set too,
but garbage collection may be off). It never touches an object without the label
``app.kubernetes.io/managed-by: volcano-job-webhook`` (docs/volcano-behaviour.md#side-objects).

The shape is controller-runtime's ``For(Job).Owns(ConfigMap, Service, Secret, NetworkPolicy)``: a
watch-backed cache of Jobs and one of each owned kind (only objects with our label, indexed by
owning job); an event on a Job queues it, an event on an owned object queues its owner. Workers
reconcile from the caches alone — a reconcile whose objects are as they should be makes no API call
at all — and write straight to the API: a POST for what is missing (it never takes over an object
of the same name someone else made), server-side apply for what drifted, delete for what is no
longer wanted. What an apply returns goes into the cache at once, so the watch event
of our own write changes nothing and queues nothing. A periodic resync (and gaining leadership)
queues every job at low priority; watch events go first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.backoff import with_retries
from volcano_job_webhook.kube.informer import Informer, JobInformer
from volcano_job_webhook.kube.records import JobRecord, digest, digested, has_digests, resource_version
from volcano_job_webhook.kube.rest import Rest, widen_pool
from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.base import Digest
from volcano_job_webhook.plugins.keys import JOB_API_VERSION, JobKey

from .compare import Changes, changes
from .kinds import (
    EVENT,
    FIELD_MANAGER,
    MANAGED_SELECTOR,
    OWNED,
    OwnedRecord,
    managed,
    owner_job,
    owner_uid,
)
from .limits import oversize
from .metrics import ReconcilerMetrics
from .workqueue import WorkQueue

log = logging.getLogger(__name__)

# A reconcile that finds the cache behind the API server (an object exists that the cache does not
# hold yet) starts over with the fresh object, at most this many times.
ATTEMPTS = 3


READS = frozenset({"get", "list"})


class NotLeading(RuntimeError):
    """A write not sent: this replica stopped leading (or is stopping)."""


class _CacheBehind(Exception):
    """An owned object exists that the cache did not hold yet; it holds it now."""


class Reconciler:
    """The caches, the work queue and the workers. ``is_leader`` gates every write."""

    def __init__(
        self,
        api: client.ApiClient,
        chain: Chain | None = None,
        *,
        namespaces: Iterable[str] = (),
        resync_seconds: float = 300.0,
        workers: int = 4,
        is_leader: Callable[[], bool] = lambda: True,
        metrics: ReconcilerMetrics | None = None,
        on_synced: Callable[[], None] | None = None,
    ) -> None:
        self.chain = chain or Chain()
        self.namespaces = list(namespaces)
        self.resync_seconds = resync_seconds
        self.workers = workers
        self.is_leader = is_leader
        self.metrics = metrics or ReconcilerMetrics()
        # Called once, when every cache has listed (the process settles its memory then).
        self.on_synced = on_synced
        watches = len(self.namespaces or [""]) * (1 + len(OWNED))
        widen_pool(api, watches + workers * 4 + 4)
        self.rest = Rest(api)
        self.queue = WorkQueue()
        self.jobs = JobInformer(api, self.namespaces, on_event=self._on_job)
        self.owned: dict[str, Informer[OwnedRecord]] = {
            kind: Informer(api, resource, self.namespaces, transform=OwnedRecord, label_selector=MANAGED_SELECTOR,
                           on_event=self._owned_handler(kind), index=_owner, deleted_objects=kind == "Secret")
            for kind, resource in OWNED.items()
        }
        # The last state of Secrets deleted under a job that is still there, by job: what the
        # plugins see of them when they are made again, so that a deleted SSH Secret comes back
        # with the keys the job's running Pods hold. Dropped once made again or no longer wanted.
        self._deleted: dict[JobKey, dict[tuple[str, str], dict[str, Any]]] = {}
        self._deleted_lock = threading.Lock()
        # Writes of one reconcile go out together (a new job's objects in one round trip).
        self._writers = ThreadPoolExecutor(max_workers=workers * 4, thread_name_prefix="reconcile-write")
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        # Warnings already recorded on a job, by (job, reason, object): the job's uid and the message.
        self._reported: dict[tuple[JobKey, str, str], str] = {}
        self._reported_lock = threading.Lock()
        self.metrics.queue_depth.set_function(lambda: len(self.queue))
        self.metrics.cached_jobs.set_function(lambda: len(self.jobs))
        for kind, informer in self.owned.items():
            self.metrics.cached_objects.labels(kind).set_function(informer.__len__)

    # Lifecycle -----------------------------------------------------------------------------------

    @property
    def informers(self) -> list[Informer[Any]]:
        return [self.jobs, *self.owned.values()]

    @property
    def ready(self) -> bool:
        return all(informer.synced for informer in self.informers)

    def start(self) -> None:
        for informer in self.informers:
            informer.start()
        for i in range(self.workers):
            self._spawn(self._work, f"reconcile-worker-{i}")
        self._spawn(self._resync_loop, "reconcile-resync")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout: float = 1.5) -> None:
        """Stop taking work and watching at once; give in-flight reconciles ``timeout`` to finish."""
        self._stop.set()
        self._wake.set()
        self.queue.shutdown()
        for informer in self.informers:
            informer.cancel()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for informer in self.informers:
            informer.join(deadline)
        self._writers.shutdown(wait=False, cancel_futures=True)

    def leadership_changed(self, leading: bool) -> None:
        """Called by the leader elector: on gaining leadership every job is queued at once."""
        if leading:
            self._wake.set()

    # Feeding the queue ---------------------------------------------------------------------------

    def _on_job(self, kind: str, job: JobRecord) -> None:
        self.queue.add(job.key)

    def _owned_handler(self, kind: str) -> Callable[[str, Any], None]:
        def on_event(event: str, obj: OwnedRecord | dict[str, Any]) -> None:
            # A deletion the watch saw comes as the object it was (Secrets: see deleted_objects).
            owner = obj.owner if isinstance(obj, OwnedRecord) else owner_job(obj)
            if owner is None:
                return
            ident = (kind, obj.key[1] if isinstance(obj, OwnedRecord) else obj["metadata"]["name"])
            with self._deleted_lock:
                if event == "DELETED" and isinstance(obj, dict):
                    self._deleted.setdefault(owner, {})[ident] = obj
                elif event != "DELETED" and ident in self._deleted.get(owner, {}):
                    del self._deleted[owner][ident]
                    if not self._deleted[owner]:
                        del self._deleted[owner]
            self.queue.add(owner)
        return on_event

    def resync(self) -> int:
        """Queue, at low priority, every known job and the owner of every cached object (jobs deleted
        while nobody watched leave such orphans). From the caches: no API call. Returns the count."""
        keys: set[JobKey] = {job.key for job in self.jobs.items()}
        for informer in self.owned.values():
            keys.update(cast("list[JobKey]", informer.index_keys()))
        for key in keys:
            self.queue.add(key, low=True)
        return len(keys)

    def _resync_loop(self) -> None:
        while not self._stop.is_set() and not self.ready:
            self._stop.wait(0.05)
        if self.on_synced is not None:
            self.on_synced()
        last: float | None = None
        was_leader = False
        while not self._stop.is_set():
            leading = self.is_leader()
            due = last is None or time.monotonic() - last >= self.resync_seconds
            if leading and (due or not was_leader):
                count = self.resync()
                last = time.monotonic()
                log.info("resync: %d jobs queued%s", count, "" if was_leader else " (leadership gained)")
            was_leader = leading
            # Woken at once by leadership_changed; polling is_leader too covers electors that do not call it.
            self._wake.wait(0.2)
            self._wake.clear()

    # Workers -------------------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            if not (self.ready and self.is_leader()):
                # Not ours to write now: keys wait in the queue (at most one entry per job).
                self._stop.wait(0.1)
                continue
            key = self.queue.get(timeout=0.2)
            if key is None:
                continue
            try:
                if not self.is_leader():
                    self.queue.add(key)
                    continue
                self.reconcile(cast("JobKey", key))
                self.queue.forget(key)
                self.metrics.reconciles.labels("success").inc()
            except NotLeading:
                self.queue.add(key)  # the next leader (this replica again, or another) does it
            except Exception as exc:
                delay = self.queue.add_rate_limited(key)
                self.metrics.reconciles.labels("error").inc()
                log.warning("reconcile of %s/%s failed (%s); retrying in %.2fs", *key, _describe(exc), delay)  # type: ignore[misc]
            finally:
                self.queue.done(key)

    def _api(self, verb: str, kind: str, fn: Callable[[], Any]) -> Any:
        def count(exc: BaseException) -> None:
            self.metrics.api_errors.labels(str(getattr(exc, "status", None) or type(exc).__name__)).inc()

        def attempt() -> Any:
            # Asked before every attempt, retries included: a replica that lost the Lease while
            # backing off must not write after its renew deadline.
            if verb not in READS and not self._may_write():
                raise NotLeading(f"{verb} of a {kind}: no longer the leader")
            self.metrics.api_requests.labels(verb, kind).inc()
            return fn()

        return with_retries(attempt, on_error=count)

    # Reconcile -----------------------------------------------------------------------------------

    def _may_write(self) -> bool:
        # Stopping: a reconcile with many writes left ends at its next one (the next leader redoes it).
        return not self._stop.is_set() and self.is_leader()

    def reconcile(self, key: JobKey) -> None:
        """Bring one job's side objects to the desired state. Raises on API failure (the key is retried)."""
        for _ in range(ATTEMPTS):
            try:
                self._reconcile(key)
                return
            except _CacheBehind:
                continue
        raise RuntimeError(f"job {key[0]}/{key[1]}: the cache stayed behind the API server")

    def _records(self, key: JobKey) -> dict[tuple[str, str], OwnedRecord]:
        return {(kind, record.key[1]): record for kind, informer in self.owned.items() for record in informer.by_index(key)}

    def _reconcile(self, key: JobKey) -> None:
        namespace, name = key
        job = self.jobs.get(namespace, name)
        uid = job.uid if job is not None else None
        records = self._records(key)
        # Nothing changed since a reconcile found everything in order (a steady resync): the answer
        # would be the same, so it is not worked out again.
        seen = {ident: r.version for ident, r in records.items()}
        if job is not None and job.reconciled == _fingerprint(seen):
            return
        # Objects of an earlier Job of the same name (deleted, then made again): never adopted —
        # they hold its SSH key, and a second controller reference would be refused.
        others = {ident: r for ident, r in records.items() if r.owner_uid != uid}
        for (kind, obj_name), record in others.items():
            if self._may_write() and self._delete(kind, namespace, obj_name, record.uid):
                seen.pop((kind, obj_name))
                log.info("deleted %s %s/%s: its job %s is gone", kind, namespace, obj_name, name)
        mine = {ident: r.object() for ident, r in records.items() if ident not in others}
        wanted: set[tuple[str, str]] = set()
        if job is None or job.deleting:
            self._forget(key)
        else:
            try:
                # A finished job starts no Pod again: its objects go, as Volcano's own do.
                desired = [] if job.finished else self.chain.resources(Job.from_object(job.object()), self._existing(key, uid, mine))
            except PluginError as exc:
                # A job we cannot read is left as it is: deleting its objects could break running Pods.
                log.warning("job %s/%s: not reconciled: %s", namespace, name, exc)
                self.metrics.reconciles.labels("invalid-job").inc()
                self._warn(job, "InvalidPlugins", "", str(exc))
                self._settled(job, seen)
                return
            wanted = self._make(job, desired, mine, seen)
            self._keep_deleted(key, wanted)
        for (kind, obj_name), obj in mine.items():
            if ((kind, obj_name) not in wanted and self._may_write()
                    and self._delete(kind, namespace, obj_name, obj["metadata"].get("uid"))):
                seen.pop((kind, obj_name), None)
                log.info("deleted %s %s/%s: job %s no longer needs it", kind, namespace, obj_name, name)
        if job is not None:
            self._settled(job, seen)

    def _settled(self, job: JobRecord, versions: dict[tuple[str, str], int]) -> None:
        """Remember the job's objects as this reconcile left them (what it found, with what it wrote
        and without what it deleted) — unless a write was left out for want of leadership. A change
        made meanwhile by someone else is not in it, so it is looked at."""
        if self._may_write():
            job.reconciled = _fingerprint(versions)

    def _existing(self, key: JobKey, uid: str | None, live: dict[tuple[str, str], dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        """What the plugins see of the job's objects: the live ones, and the last state of those
        deleted under it (a deleted SSH Secret comes back with the keys its running Pods hold)."""
        with self._deleted_lock:
            deleted = {ident: obj for ident, obj in self._deleted.get(key, {}).items() if owner_uid(obj) == uid}
        return {**deleted, **live}

    def _keep_deleted(self, key: JobKey, wanted: set[tuple[str, str]]) -> None:
        with self._deleted_lock:
            held = self._deleted.get(key)
            if held is None:
                return
            for ident in [i for i in held if i not in wanted]:
                del held[ident]
            if not held:
                del self._deleted[key]

    def _make(self, job: JobRecord, desired: list[dict[str, Any]],
              existing: dict[tuple[str, str], dict[str, Any]], versions: dict[tuple[str, str], int]) -> set[tuple[str, str]]:
        """Write what differs of ``desired``; return the (kind, name) of every object the job wants,
        and put the version of each object written in ``versions``. Compared as cached: long data
        values as digests on both sides."""
        wanted = set()
        writes: list[tuple[dict[str, Any], dict[str, Any] | None, Changes | None]] = []
        for obj in desired:
            ident = (obj["kind"], obj["metadata"]["name"])
            wanted.add(ident)
            too_big = oversize(obj)
            if too_big is not None:
                # Never sent: the API server would refuse it on every retry. The job's other objects
                # are still made; the job is looked at again when it changes.
                log.warning("job %s/%s: %s", *job.key, too_big.message())
                self.metrics.reconciles.labels("too-large").inc()
                self._warn(job, "ObjectTooLarge", ident[1], too_big.message())
                continue
            current = existing.get(ident)
            todo = None if current is None else changes(current, digested(obj))
            if current is None or todo:
                writes.append((obj, current, todo))
        versions.update(self._write_all(job, writes))
        return wanted

    def _delete(self, kind: str, namespace: str, name: str, uid: str | None) -> bool:
        deleted = bool(self._api("delete", kind, lambda: self.rest.delete(OWNED[kind], namespace, name, uid)))
        if deleted:
            self.metrics.writes.labels(kind, "delete").inc()
        return deleted

    def _write_all(self, job: JobRecord, writes: list[tuple[dict[str, Any], dict[str, Any] | None, Changes | None]]) -> dict[tuple[str, str], int]:
        """The job's writes, at once: they are independent, and a new job's objects then take one
        round trip to the API server rather than one each. Returns the versions written."""
        if len(writes) <= 1:
            return dict(w for desired, current, todo in writes if (w := self._ensure(job, desired, current, todo)))
        futures = [self._writers.submit(self._ensure, job, desired, current, todo) for desired, current, todo in writes]
        errors = [f.exception() for f in futures]
        for error in errors:
            if isinstance(error, _CacheBehind):
                raise error
        for error in errors:
            if error is not None:
                raise error
        return dict(w for f in futures if (w := f.result()))

    def _hydrated(self, job: JobRecord, desired: dict[str, Any]) -> dict[str, Any]:
        """``desired`` with every :class:`Digest` a plugin kept (an SSH key: "keep what is there")
        replaced by the live value it stands for, read from the API server — the one value the
        cache does not hold. Starts the reconcile over when the live object is not what was kept."""
        if not has_digests(desired):
            return desired
        kind, meta = desired["kind"], desired["metadata"]
        live = self._api("get", kind, lambda: self.rest.get(OWNED[kind], meta["namespace"], meta["name"]))
        out = dict(desired)
        for field in ("data", "binaryData"):
            values = desired.get(field)
            if not isinstance(values, dict):
                continue
            found = (live or {}).get(field) or {}
            filled = {}
            for key, value in values.items():
                if isinstance(value, Digest):
                    if not isinstance(found.get(key), str) or digest(found[key]) != value:
                        self._drop_deleted(job.key, (kind, meta["name"]))
                        if live is not None:
                            self.owned[kind].store(live)
                        raise _CacheBehind()
                    value = found[key]
                filled[key] = value
            out[field] = filled
        return out

    def _drop_deleted(self, key: JobKey, ident: tuple[str, str]) -> None:
        with self._deleted_lock:
            held = self._deleted.get(key)
            if held is not None:
                held.pop(ident, None)

    def _ensure(self, job: JobRecord, desired: dict[str, Any], current: dict[str, Any] | None,
                todo: Changes | None) -> tuple[tuple[str, str], int] | None:
        """Create or update one object; returns its (kind, name) and the version written, if any."""
        kind, meta = desired["kind"], desired["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        resource, cache = OWNED[kind], self.owned[kind]
        if current is None:
            # Not in our cache: absent, made a moment ago, or there without our label (the cache
            # holds only labelled objects). A POST makes it only if no object of that name exists.
            if not self._may_write():
                return None
            if has_digests(desired):
                # Kept from a deleted object whose value the cache never held: made anew instead.
                self._drop_deleted(job.key, (kind, name))
                raise _CacheBehind()
            try:
                stored = self._api("create", kind, lambda: self.rest.create(resource, namespace, desired, FIELD_MANAGER))
            except ApiException as exc:
                if exc.status != 409:
                    raise
                live = self._api("get", kind, lambda: self.rest.get(resource, namespace, name))
                if live is None:
                    raise _CacheBehind() from None  # deleted meanwhile: start over
                if not managed(live):
                    log.info("%s %s/%s exists and is not managed by us; left alone", kind, namespace, name)
                    self._warn(job, "ResourceNotManaged", name, f"{kind} {name} exists without the label {MANAGED_SELECTOR}; left as it is")
                    return None
                # Ours, and the cache is behind: start over with it (an SSH Secret keeps its keys).
                cache.store(live)
                raise _CacheBehind() from None
            cache.store(stored)
            self.metrics.writes.labels(kind, "create").inc()
            log.info("created %s %s/%s", kind, namespace, name)
            return (kind, name), resource_version(stored)
        if not todo or not self._may_write():
            return None
        if todo.remove:
            patch = todo.removal_patch()
            stored = self._api("patch", kind, lambda: self.rest.merge_patch(resource, namespace, name, patch, FIELD_MANAGER))
            cache.store(stored)
            log.info("removed %s from %s %s/%s", ", ".join(".".join(p) for p in todo.remove), kind, namespace, name)
            if not changes(OwnedRecord(stored).object(), digested(desired)).apply:
                self.metrics.writes.labels(kind, "update").inc()
                return (kind, name), resource_version(stored)
        body = self._hydrated(job, desired)
        stored = self._api("apply", kind, lambda: self.rest.apply(resource, body, FIELD_MANAGER))
        cache.store(stored)
        self.metrics.writes.labels(kind, "update").inc()
        log.info("updated %s %s/%s", kind, namespace, name)
        return (kind, name), resource_version(stored)

    # Events on the Job ---------------------------------------------------------------------------

    def _forget(self, key: JobKey) -> None:
        with self._deleted_lock:
            self._deleted.pop(key, None)
        with self._reported_lock:
            for report in [r for r in self._reported if r[0] == key]:
                del self._reported[report]

    def _warn(self, job: JobRecord, reason: str, subject: str, message: str) -> None:
        """A Warning Event on the Job, so ``kubectl describe job`` says why; once per Job and message."""
        namespace, name = job.key
        report = (job.key, reason, subject)
        # Once per Job (by uid) and message: a job's status changes many times while its Pods
        # start, and none of that makes the warning news.
        said = f"{job.uid}\0{message}"
        with self._reported_lock:
            if self._reported.get(report) == said:
                return
            self._reported[report] = said
        if not self.is_leader():
            return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": JOB_API_VERSION, "kind": "Job", "name": name, "namespace": namespace,
                               "uid": job.uid, "resourceVersion": str(job.version)},
            "reason": reason, "message": message[:1024], "type": "Warning",
            "source": {"component": "volcano-job-webhook-reconciler"},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self.metrics.api_requests.labels("create", "Event").inc()
            self.rest.create(EVENT, namespace, body)
        except Exception as exc:
            log.info("could not record event %s on job %s/%s: %s", reason, namespace, name, _describe(exc))


def _owner(record: OwnedRecord) -> JobKey | None:
    return record.owner


def _fingerprint(versions: dict[tuple[str, str], int]) -> int:
    """A job's objects in one number: which there are, at which version."""
    return hash(tuple(sorted(versions.items())))


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if isinstance(exc, ApiException) and status:
        return f"HTTP {status}"
    return str(exc) or type(exc).__name__
