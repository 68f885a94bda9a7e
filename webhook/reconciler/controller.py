"""``volcano-webhook reconcile``: make the cluster hold each job's side objects, exactly.

For every Volcano Job the plugin chain says which objects the job needs (``Chain.resources``); the
reconciler creates the missing ones, updates drifted ones, and deletes the ones this project made
that the job no longer asks for — all of them when the job is gone (owner references are set too,
but garbage collection may be off). It never touches an object without the label
``app.kubernetes.io/managed-by: volcano-job-webhook`` (SPEC Part 1 §1.6).

Events from the job informer and a periodic resync put job keys on a work queue; worker threads
reconcile one key at a time each, and only while this replica leads.
"""

from __future__ import annotations

import copy
import logging
import threading
from datetime import datetime, timezone
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge

from volcano_job_webhook.plugins import MANAGED_BY, MANAGED_BY_LABEL, Chain, Job, PluginError

from volcano_job_webhook.kube.backoff import with_retries
from volcano_job_webhook.kube.informer import JobInformer
from volcano_job_webhook.plugins.keys import JobKey

from .kinds import KINDS, Kind
from .metrics import ReconcilerMetrics
from .workqueue import WorkQueue

log = logging.getLogger(__name__)

MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
# Fields the reconciler keeps as desired; everything else on a live object is the server's
# (defaults, allocated clusterIP) or someone else's (other labels and annotations) and is kept.
OWNED_TOP_LEVEL = ("data", "spec")


def _owned_by(obj: dict[str, Any], job_name: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == "Job" and r.get("apiVersion", "").startswith("batch.volcano.sh/") and r.get("name") == job_name for r in refs)


def _owner_job(obj: dict[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("apiVersion", "").startswith("batch.volcano.sh/"):
            return str(ref.get("name"))
    return None


def _managed(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def _covers(current: Any, desired: Any) -> bool:
    """Everything ``desired`` says is in ``current``; fields the server defaulted don't count."""
    if isinstance(desired, dict):
        return isinstance(current, dict) and all(_covers(current.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(current, list) and len(current) == len(desired) and all(map(_covers, current, desired))
    return bool(current == desired)


def _merge_desired(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """``current`` with our labels, owner reference, ``data`` and ``spec`` fields set as desired."""
    out = copy.deepcopy(current)
    meta = out.setdefault("metadata", {})
    meta["labels"] = {**(meta.get("labels") or {}), **desired["metadata"]["labels"]}
    meta["ownerReferences"] = desired["metadata"]["ownerReferences"]
    for field in OWNED_TOP_LEVEL:
        if field in desired:
            if field == "data" or not isinstance(out.get(field), dict):
                out[field] = copy.deepcopy(desired[field])
            else:
                out[field] = {**out[field], **copy.deepcopy(desired[field])}
    return out


def _needs_update(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    meta = desired["metadata"]
    if not _covers(current.get("metadata") or {}, {"labels": meta["labels"], "ownerReferences": meta["ownerReferences"]}):
        return True
    if "data" in desired and (current.get("data") or {}) != desired["data"]:
        return True
    return "spec" in desired and not _covers(current.get("spec"), desired["spec"])


class Reconciler:
    """Drives the job informer, the work queue and the workers. ``is_leader`` gates every write."""

    def __init__(
        self,
        api: client.ApiClient,
        chain: Chain | None = None,
        *,
        namespaces: Iterable[str] = (),
        resync_seconds: float = 300.0,
        workers: int = 2,
        is_leader: Callable[[], bool] = lambda: True,
        metrics: ReconcilerMetrics | None = None,
    ) -> None:
        self.api = api
        self.chain = chain or Chain()
        self.namespaces = list(namespaces)
        self.resync_seconds = resync_seconds
        self.workers = workers
        self.is_leader = is_leader
        self.metrics = metrics or ReconcilerMetrics()
        self.queue = WorkQueue()
        self.informer = JobInformer(api, self.namespaces, on_event=self._on_event)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.metrics.queue_depth.set_function(lambda: len(self.queue))

    # Lifecycle -----------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.informer.synced

    def start(self) -> None:
        self.informer.start()
        for i in range(self.workers):
            self._spawn(self._work, f"reconcile-worker-{i}")
        self._spawn(self._resync_loop, "reconcile-resync")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop taking work, let in-flight reconciles finish, stop watching."""
        self._stop.set()
        self.queue.shutdown()
        for thread in self._threads:
            thread.join(timeout)
        self.informer.stop()

    # Feeding the queue ---------------------------------------------------------------------------

    def _on_event(self, kind: str, job: dict[str, Any]) -> None:
        meta = job.get("metadata") or {}
        self.queue.add((meta.get("namespace") or "default", meta.get("name") or ""))

    def resync(self) -> None:
        """Queue every known job, and the owner of every managed object (jobs deleted while we were
        not watching leave such orphans)."""
        keys: set[JobKey] = set()
        for job in self.informer.jobs():
            meta = job.get("metadata") or {}
            keys.add((meta.get("namespace") or "default", meta.get("name") or ""))
        for kind in KINDS.values():
            for namespace in self.namespaces or [None]:
                for obj in self._api(lambda: kind.list(self.api, namespace, MANAGED_SELECTOR)):
                    owner = _owner_job(obj)
                    if owner:
                        keys.add((obj["metadata"]["namespace"], owner))
        for key in keys:
            self.queue.add(key)

    def _resync_loop(self) -> None:
        while not self._stop.wait(0.05):
            if self.informer.synced:
                break
        while not self._stop.is_set():
            if self.is_leader():
                try:
                    self.resync()
                except Exception as exc:
                    log.warning("resync failed: %s", exc)
            self._stop.wait(self.resync_seconds)

    # Workers -------------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            key = self.queue.get()
            if key is None:
                return
            try:
                if not self.is_leader():
                    # Not ours to write now; look again later (leadership may come).
                    self.queue.add_after(key, 1.0)
                    continue
                self.reconcile(key)  # type: ignore[arg-type]
                self.queue.forget(key)
                self.metrics.reconciles.labels("success").inc()
            except Exception as exc:
                delay = self.queue.add_rate_limited(key)
                self.metrics.reconciles.labels("error").inc()
                log.warning("reconcile of %s/%s failed (%s); retrying in %.2fs", *key, _describe(exc), delay)  # type: ignore[misc]
            finally:
                self.queue.done(key)

    def _api(self, fn: Callable[[], Any]) -> Any:
        def count(exc: BaseException) -> None:
            self.metrics.api_errors.labels(str(getattr(exc, "status", None) or type(exc).__name__)).inc()

        return with_retries(fn, on_error=count)

    def _managed_objects(self, namespace: str, job_name: str) -> dict[tuple[str, str], dict[str, Any]]:
        found = {}
        for kind in KINDS.values():
            for obj in self._api(lambda: kind.list(self.api, namespace, MANAGED_SELECTOR)):
                if _owned_by(obj, job_name):
                    found[(kind.kind, obj["metadata"]["name"])] = obj
        return found

    def reconcile(self, key: JobKey) -> None:
        """Bring one job's side objects to the desired state. Raises on API failure (the key is retried)."""
        namespace, name = key
        raw = self.informer.get(namespace, name)
        existing = self._managed_objects(namespace, name)
        desired: list[dict[str, Any]] = []
        if raw is not None and not (raw.get("metadata") or {}).get("deletionTimestamp"):
            try:
                desired = self.chain.resources(Job.from_object(raw), existing)
            except PluginError as exc:
                # A job we cannot read is left as it is: deleting its objects could break running Pods.
                log.warning("job %s/%s: not reconciled: %s", namespace, name, exc)
                self.metrics.reconciles.labels("invalid-job").inc()
                self._event(raw, "InvalidPlugins", str(exc))
                return
        wanted = set()
        for obj in desired:
            wanted.add((obj["kind"], obj["metadata"]["name"]))
            self._ensure(KINDS[obj["kind"]], obj, existing.get((obj["kind"], obj["metadata"]["name"])))
        for (kind_name, obj_name), obj in existing.items():
            if (kind_name, obj_name) not in wanted and self.is_leader():
                if self._api(lambda: KINDS[kind_name].delete(self.api, namespace, obj_name, obj["metadata"].get("uid"))):
                    self.metrics.writes.labels(kind_name, "delete").inc()
                    log.info("deleted %s %s/%s: job %s no longer needs it", kind_name, namespace, obj_name, name)

    def _ensure(self, kind: Kind, desired: dict[str, Any], current: dict[str, Any] | None) -> None:
        meta = desired["metadata"]
        for _ in range(5):
            if current is None:
                current = self._api(lambda: kind.read(self.api, meta["namespace"], meta["name"]))
            if current is not None and not _managed(current):
                log.info("%s %s/%s exists and is not managed by us; left alone", kind.kind, meta["namespace"], meta["name"])
                job = self.informer.get(meta["namespace"], meta["ownerReferences"][0]["name"])
                if job is not None:
                    self._event(job, "ResourceNotManaged",
                                f"{kind.kind} {meta['name']} exists without the label {MANAGED_SELECTOR}; left as it is")
                return
            if not self.is_leader():
                return
            try:
                if current is None:
                    self._api(lambda: kind.create(self.api, desired))
                    self.metrics.writes.labels(kind.kind, "create").inc()
                    log.info("created %s %s/%s", kind.kind, meta["namespace"], meta["name"])
                elif _needs_update(current, desired):
                    self._api(lambda: kind.replace(self.api, _merge_desired(current, desired)))  # type: ignore[arg-type]
                    self.metrics.writes.labels(kind.kind, "update").inc()
                    log.info("updated %s %s/%s", kind.kind, meta["namespace"], meta["name"])
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
                # AlreadyExists (created meanwhile) or Conflict (stale resourceVersion): read again.
                current = None
        raise RuntimeError(f"{kind.kind} {meta['namespace']}/{meta['name']}: still conflicting after 5 attempts")


    def _event(self, job: dict[str, Any], reason: str, message: str) -> None:
        """A Warning Event on the Job, so ``kubectl describe job`` says why. Best effort."""
        if not self.is_leader():
            return
        meta = job.get("metadata") or {}
        now = datetime.now(timezone.utc)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta.get('name')}.", namespace=meta.get("namespace")),
            involved_object=client.V1ObjectReference(
                api_version=job.get("apiVersion", "batch.volcano.sh/v1alpha1"), kind="Job",
                name=meta.get("name"), namespace=meta.get("namespace"), uid=meta.get("uid"),
            ),
            reason=reason, message=message[:1024], type="Warning",
            source=client.V1EventSource(component="volcano-job-webhook-reconciler"),
            first_timestamp=now, last_timestamp=now, count=1,
        )
        try:
            client.CoreV1Api(self.api).create_namespaced_event(meta.get("namespace") or "default", body, _request_timeout=10)
        except Exception as exc:
            log.info("could not record event %s on job %s/%s: %s", reason, meta.get("namespace"), meta.get("name"), _describe(exc))


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    return f"HTTP {status}" if status else type(exc).__name__
