"""One job's reconcile: make the cluster hold the side objects the plugins we run want for it, exactly.

For a Volcano Job (or an Indexed Job or JobSet that opted in, docs/workloads.md: one reconciler
per kind, each asked for the :class:`~volcano_job_webhook.plugins.kinds.ObjectKey` of one job of its kind) the plugin chain says which objects the job needs (``Chain.resources``: the plugins
we run, not those Volcano's own controller runs, docs/install.md#who-runs-what); the reconcile creates
the missing ones, repairs drifted ones, and deletes the ones this project made that the job no longer
asks for — all of them when the job is gone (owner references are set too, but garbage collection
may be off) or finished. Objects are matched to their Job by the uid of its controller reference:
those of an earlier Job of the same name are deleted, never adopted. It never touches an object
without the label ``app.kubernetes.io/managed-by: volcano-job-webhook``.

Everything is read from the caches: a reconcile whose objects are as they should be makes no API
call, and one that finds the job's objects at the versions it last left them in order does not even
work the answer out again (the fingerprint kept on the Job's record).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.kube.records import JobRecord, Version, digested
from volcano_job_webhook.plugins import Chain, PluginError, read_workload
from volcano_job_webhook.plugins.kinds import Kind, ObjectKey

from .compare import changes
from .events import EventRecorder
from .kinds import OwnedRecord, controlling
from .limits import oversize
from .metrics import ReconcilerMetrics
from .writer import CacheBehind, Ident, ObjectWriter, Write

log = logging.getLogger(__name__)

# A reconcile that finds the cache behind the API server (an object exists that the cache does not
# hold yet) starts over with the fresh object, at most this many times.
ATTEMPTS = 3


class JobReconciler:
    """Reconciles the jobs of one kind, each asked for by its :class:`ObjectKey`; of the owned
    objects it reads only those a job of its kind controls."""

    def __init__(self, kind: Kind, jobs: Informer[Any], owned: Mapping[str, Informer[OwnedRecord]], chain: Chain,
                 writer: ObjectWriter, events: EventRecorder, metrics: ReconcilerMetrics, may_write: Callable[[], bool]) -> None:
        self.kind = kind
        self.jobs = jobs
        self.owned = owned
        self.chain = chain
        self.writer = writer
        self.events = events
        self.metrics = metrics
        self.may_write = may_write
        # The last state of Secrets deleted under a job that is still there, by job: what the
        # plugins see of them when they are made again, so that a deleted SSH Secret comes back
        # with the keys the job's running Pods hold. Dropped once made again or no longer wanted.
        self._deleted: dict[ObjectKey, dict[Ident, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def on_owned(self, kind: str, event: str, obj: OwnedRecord | dict[str, Any], owner: ObjectKey) -> None:
        """An event on an object a job of this kind controls (the controller queues the job next).
        A deletion the watch saw comes as the object it was (Secrets, see the informer's
        ``deleted_objects``): kept for the plugins; the object made again, it is dropped."""
        gone = obj if event == "DELETED" and isinstance(obj, dict) else None
        if gone is None and not self._deleted:
            return  # nothing kept, nothing to drop: the usual event takes no lock
        ident = (kind, obj.key[1] if isinstance(obj, OwnedRecord) else obj["metadata"]["name"])
        with self._lock:
            if gone is not None:
                self._deleted.setdefault(owner, {})[ident] = gone
            elif event != "DELETED" and ident in self._deleted.get(owner, {}):
                self._drop_deleted(owner, ident)

    def reconcile(self, key: ObjectKey) -> None:
        """Bring one job's side objects to the desired state. Raises on API failure (the key is retried)."""
        for _ in range(ATTEMPTS):
            try:
                self._reconcile(key)
                return
            except CacheBehind as behind:
                if behind.stale is not None:
                    with self._lock:
                        self._drop_deleted(key, behind.stale)
        raise RuntimeError(f"{self.kind.noun} {key}: the cache stayed behind the API server")

    def _records(self, key: ObjectKey) -> dict[Ident, OwnedRecord]:
        """The job's objects: those its kind's job of that name controls (a Volcano Job and a batch
        Job of one name are two jobs)."""
        return {(kind, record.key[1]): record for kind, informer in self.owned.items() for record in informer.by_index(key)
                if record.owner_kind is self.kind}

    def _reconcile(self, key: ObjectKey) -> None:
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
            if self.may_write() and self.writer.delete(kind, namespace, obj_name, record.uid):
                seen.pop((kind, obj_name))
                log.info("deleted %s %s/%s: its job %s is gone", kind, namespace, obj_name, name)
        mine = {ident: r.object() for ident, r in records.items() if ident not in others}
        wanted: set[Ident] = set()
        if job is None or job.deleting:
            self._forget(key)
        else:
            try:
                # A finished job starts no Pod again: its objects go, as Volcano's own do.
                desired = [] if job.finished else self.chain.resources(read_workload(job.object()), self._existing(key, uid, mine))
            except PluginError as exc:
                # A job we cannot read is left as it is: deleting its objects could break running Pods.
                log.warning("job %s/%s: not reconciled: %s", namespace, name, exc)
                self.metrics.reconciles.labels("invalid-job").inc()
                self.events.warn(job, "InvalidPlugins", "", str(exc))
                self._settled(job, seen)
                return
            wanted = self._make(job, desired, mine, seen)
            self._keep_deleted(key, wanted)
        for (kind, obj_name), obj in mine.items():
            if ((kind, obj_name) not in wanted and self.may_write()
                    and self.writer.delete(kind, namespace, obj_name, obj["metadata"].get("uid"))):
                seen.pop((kind, obj_name), None)
                log.info("deleted %s %s/%s: job %s no longer needs it", kind, namespace, obj_name, name)
        if job is not None:
            self._settled(job, seen)

    def _settled(self, job: JobRecord, versions: dict[Ident, Version]) -> None:
        """Remember the job's objects as this reconcile left them (what it found, with what it wrote
        and without what it deleted) — unless a write was left out for want of leadership. A change
        made meanwhile by someone else is not in it, so it is looked at."""
        if self.may_write():
            job.reconciled = _fingerprint(versions)

    def _make(self, job: JobRecord, desired: list[dict[str, Any]], existing: dict[Ident, dict[str, Any]],
              versions: dict[Ident, Version]) -> set[Ident]:
        """Write what differs of ``desired``; return the (kind, name) of every object the job wants,
        and put the version of each object written in ``versions``. Compared as cached: long data
        values as digests on both sides."""
        wanted = set()
        writes: list[Write] = []
        for obj in desired:
            ident = (obj["kind"], obj["metadata"]["name"])
            wanted.add(ident)
            too_big = oversize(obj)
            if too_big is not None:
                # Never sent: the API server would refuse it on every retry. The job's other objects
                # are still made; the job is looked at again when it changes.
                log.warning("job %s/%s: %s", *job.key, too_big.message())
                self.metrics.reconciles.labels("too-large").inc()
                self.events.warn(job, "ObjectTooLarge", ident[1], too_big.message())
                continue
            current = existing.get(ident)
            todo = None if current is None else changes(current, digested(obj))
            if current is None or todo:
                writes.append((obj, current, todo))
        versions.update(self.writer.write_all(job, writes))
        return wanted

    # What the plugins see of a job's objects -----------------------------------------------------

    def _existing(self, key: ObjectKey, uid: str | None, live: dict[Ident, dict[str, Any]]) -> dict[Ident, dict[str, Any]]:
        """The live objects, and the last state of those deleted under the job (a deleted SSH Secret
        comes back with the keys its running Pods hold)."""
        with self._lock:
            deleted = {ident: obj for ident, obj in self._deleted.get(key, {}).items() if controlling(obj)[2] == uid}
        return {**deleted, **live}

    def _keep_deleted(self, key: ObjectKey, wanted: set[Ident]) -> None:
        with self._lock:
            for ident in [i for i in self._deleted.get(key, {}) if i not in wanted]:
                self._drop_deleted(key, ident)

    def _drop_deleted(self, key: ObjectKey, ident: Ident) -> None:
        held = self._deleted.get(key)
        if held is not None:
            held.pop(ident, None)
            if not held:
                del self._deleted[key]

    def _forget(self, key: ObjectKey) -> None:
        with self._lock:
            self._deleted.pop(key, None)
        self.events.forget(key)


def _fingerprint(versions: dict[Ident, Version]) -> int:
    """A job's objects in one number: which there are, at which version."""
    return hash(tuple(sorted(versions.items())))
