"""One workload's reconcile: the cluster made to hold exactly the side objects the plugins we run want for a
Volcano Job, or an Indexed Job or JobSet that opted in (docs/workloads.md); all of them deleted when it
is gone or finished. Objects are matched to their workload by their controller reference's uid (an earlier
one's of the same name are deleted, never adopted), and read from the caches: a workload in order costs no call.
"""

from __future__ import annotations

import base64
import binascii
import functools
import logging
import threading
from collections.abc import Mapping
from typing import Any

import orjson

from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.kube.records import JobRecord, Version
from volcano_job_webhook.plugins import Chain, PluginError, read_workload
from volcano_job_webhook.plugins.budget import DATA_LIMIT, STORE_LIMIT
from volcano_job_webhook.plugins.kinds import CONFIG_MAP, SECRET, Kind, ObjectKey

from .compare import changes
from .digests import digested
from .events import EventRecorder
from .expectations import GONE, Expectations, Ident
from .metrics import ReconcilerMetrics
from .owned import controlling
from .transforms import OwnedRecord
from .writer import ObjectWriter, Write

log = logging.getLogger(__name__)


def _decoded_length(value: str) -> int:
    try:
        return len(base64.b64decode(value, validate=True))
    except (binascii.Error, ValueError):
        return len(value)


def _data_size(obj: dict[str, Any]) -> int:
    """The bytes of a ConfigMap's or Secret's data maps, decoded: base64 a Secret's data, a ConfigMap's binaryData."""
    encoded = "data" if obj.get("kind") == SECRET.kind else "binaryData"
    return sum(_decoded_length(v) if field == encoded else len(v.encode())
               for field in ("data", "binaryData", "stringData") for v in (obj.get(field) or {}).values())


def oversize(obj: dict[str, Any]) -> str | None:
    """Why the API server would refuse ``obj`` on every retry (its data or itself over plugins/budget.py's
    limits), in a sentence naming it, its size and the limit; None when it can be stored."""
    kind, name = obj.get("kind", ""), (obj.get("metadata") or {}).get("name", "")
    if kind in (CONFIG_MAP.kind, SECRET.kind) and (size := _data_size(obj)) > DATA_LIMIT:
        return f"{kind} {name} not written: its data is {size} bytes, over the {DATA_LIMIT}-byte limit on a {kind}'s data"
    if (size := len(orjson.dumps(obj))) > STORE_LIMIT:
        return (f"{kind} {name} not written: the object is {size} bytes, over the {STORE_LIMIT}-byte limit on a stored object "
                "(etcd --max-request-bytes)")
    return None


class WorkloadReconciler:
    """Reconciles the workloads of one kind, each asked for by its :class:`ObjectKey`; of the owned
    objects it reads only those a workload of its kind controls."""

    def __init__(self, kind: Kind, workloads: Informer[Any], owned: Mapping[str, Informer[OwnedRecord]], chain: Chain,
                 writer: ObjectWriter, events: EventRecorder, metrics: ReconcilerMetrics) -> None:
        self.kind = kind
        self.workloads = workloads
        self.owned = owned
        self.chain = chain
        self.writer = writer
        self.events = events
        self.metrics = metrics
        self.expectations = Expectations()
        # By running workload, the last state of its Secrets deleted under it, until made again or no longer
        # wanted: the workload's Pods mount the SSH keys with subPath, which a new key pair would not reach,
        # so a deleted SSH Secret comes back with the keys they hold (the cache keeps only digests).
        self._deleted: dict[ObjectKey, dict[Ident, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def on_owned(self, kind: str, event: str, obj: OwnedRecord | dict[str, Any], owner: ObjectKey) -> None:
        """An event on an object a workload of this kind controls, for the workload's expectations; a deleted Secret
        comes as the object it was (the informer's ``deleted_objects``), kept while its workload runs."""
        ident = (kind, obj.key[1] if isinstance(obj, OwnedRecord) else obj["metadata"]["name"])
        self.expectations.observe(owner, ident, GONE if event == "DELETED" else getattr(obj, "version", GONE))
        if event == "DELETED" and isinstance(obj, dict):
            workload = self.workloads.get(*owner)
            if workload is not None and not workload.deleting and workload.uid == controlling(obj)[2]:
                with self._lock:
                    self._deleted.setdefault(owner, {})[ident] = obj
        elif self._deleted and ident in self._deleted.get(owner, {}):  # the usual event takes no lock
            with self._lock:
                self._drop_deleted(owner, ident)

    def reconcile(self, key: ObjectKey) -> float | None:
        """Bring one workload's side objects to the desired state, raising on an API failure (retried with
        backoff); while the caches have yet to show its last writes, the seconds it waits for them."""
        namespace, name = key
        cached = functools.partial(self._cached_version, key)
        wait = self.expectations.pending(key, cached)
        if wait:
            return wait
        workload = self.workloads.get(namespace, name)
        uid = workload.uid if workload is not None else None
        # Those its kind's workload of that name controls: a Volcano Job and a batch Job of one name are two workloads.
        records = {(kind, r.key[1]): r for kind, informer in self.owned.items() for r in informer.by_index(key) if r.workload_kind is self.kind}
        # Objects of an earlier Job of the same name (deleted, then made again): never adopted — they
        # hold its SSH key, and a second controller reference would be refused.
        deletes = {ident: r.uid for ident, r in records.items() if r.workload_uid != uid}
        mine = {ident: r.object() for ident, r in records.items() if ident not in deletes}
        wanted: set[Ident] = set()
        writes: list[Write] = []
        if workload is None or workload.deleting:
            self._clear(key)
        else:
            try:
                # A finished workload starts no Pod again: its objects go, as Volcano's own do (and a
                # workload that no longer opts in has none).
                desired = [] if workload.finished or not workload.opted_in else self.chain.resources(read_workload(workload.object()), self._existing(key, uid, mine))
                wanted, writes = self._plan(workload, desired, mine)
                self._keep_deleted(key, uid, wanted)
            except PluginError as exc:
                # A workload we cannot read is left as it is: deleting its objects could break running Pods.
                log.warning("%s %s/%s: not reconciled: %s", self.kind.noun, namespace, name, exc)
                self.metrics.reconciles.labels("invalid-job").inc()
                self.events.warn(workload, "InvalidPlugins", "", str(exc))
                wanted = set(mine)
        deletes.update({ident: obj["metadata"].get("uid") for ident, obj in mine.items() if ident not in wanted})
        # What this round deletes is made in the next, once the cache shows it gone: a create now would
        # meet the object being deleted.
        writes = [w for w in writes if (w[0]["kind"], w[0]["metadata"]["name"]) not in deletes]
        self.writer.write_all(key, workload, writes, deletes, self.expectations)
        # What the cache already shows (an object already gone, an apply that changed nothing) is met now:
        # no event will come for it.
        self.expectations.pending(key, cached)
        return None

    def _cached_version(self, key: ObjectKey, ident: Ident) -> Version | None:
        record = self.owned[ident[0]].get(key.namespace, ident[1])
        return GONE if record is None else record.version

    def _plan(self, workload: JobRecord, desired: list[dict[str, Any]], existing: dict[Ident, dict[str, Any]]) -> tuple[set[Ident], list[Write]]:
        """The (kind, name) of every object the workload wants, and the writes of those that differ as cached."""
        wanted = set()
        writes: list[Write] = []
        for obj in desired:
            ident = (obj["kind"], obj["metadata"]["name"])
            wanted.add(ident)
            too_big = oversize(obj)
            if too_big is not None:
                # Never sent (refused on every retry); the workload's other objects are still made.
                log.warning("%s %s/%s: %s", self.kind.noun, *workload.key, too_big)
                self.metrics.reconciles.labels("too-large").inc()
                self.events.warn(workload, "ObjectTooLarge", ident[1], too_big)
                continue
            current = existing.get(ident)
            todo = None if current is None else changes(current, digested(obj))
            if current is None or todo:
                writes.append((obj, current, todo))
        return wanted, writes

    def _existing(self, key: ObjectKey, uid: str | None, live: dict[Ident, dict[str, Any]]) -> dict[Ident, dict[str, Any]]:
        """The live objects, and the last state of those deleted under the workload (a deleted SSH Secret
        comes back with the keys its running Pods hold)."""
        with self._lock:
            deleted = {ident: obj for ident, obj in self._deleted.get(key, {}).items() if controlling(obj)[2] == uid}
        return {**deleted, **live}

    def _keep_deleted(self, key: ObjectKey, uid: str | None, wanted: set[Ident]) -> None:
        """Keep only what the workload of ``uid`` still wants of its deleted Secrets."""
        with self._lock:
            for ident, obj in list(self._deleted.get(key, {}).items()):
                if ident not in wanted or controlling(obj)[2] != uid:
                    self._drop_deleted(key, ident)

    def _drop_deleted(self, key: ObjectKey, ident: Ident) -> None:
        held = self._deleted.get(key)
        if held is not None:
            held.pop(ident, None)
            if not held:
                del self._deleted[key]

    def _clear(self, key: ObjectKey) -> None:
        with self._lock:
            self._deleted.pop(key, None)
        self.events.clear(key)
