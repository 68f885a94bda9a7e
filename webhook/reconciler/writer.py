"""The reconciler's writes, all of a workload's at once: a POST makes what is missing (never taking over another's
object of that name), a merge patch and then server-side apply repair drift, a delete is conditional on the
cached uid. Each answer is what the workload's :class:`~.expectations.Expectations` wait for the cache to show.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.records import JobRecord, Version, resource_version
from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.plugins.base import Digest
from volcano_job_webhook.plugins.kinds import ObjectKey

from .compare import Changes, changes
from .digests import digest, digested, has_digests
from .events import EventRecorder
from .expectations import GONE, Expectations, Ident
from .metrics import ReconcilerMetrics
from .owned import FIELD_MANAGER, MANAGED_SELECTOR, OWNED, managed
from .transforms import OwnedRecord

log = logging.getLogger(__name__)

Write = tuple[dict[str, Any], dict[str, Any] | None, Changes | None]  # desired, as cached, what to do
Written = dict[Ident, Version | None]


class CacheBehind(Exception):
    """The API server holds a version the cache does not yet: the reconcile fails, retried with its backoff
    (the cache's event queues it sooner)."""


class Stopping(Exception):
    """The process is stopping: no request is sent any more."""


class ObjectWriter:
    def __init__(self, rest: Rest, metrics: ReconcilerMetrics, events: EventRecorder, threads: int) -> None:
        self.rest = rest
        self.metrics = metrics
        self.events = events
        self._closed = False
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reconcile-write")

    def close(self) -> None:
        """Send nothing more: what is queued is dropped, a reconcile under way ends at its next request."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _call(self, verb: str, kind: str, fn: Callable[[], Any]) -> Any:
        if self._closed:
            raise Stopping(f"{verb} of a {kind} not sent: stopping")
        self.metrics.api_requests.labels(verb, kind).inc()
        try:
            return fn()
        except Exception as exc:
            self.metrics.api_errors.labels(str(getattr(exc, "status", None) or type(exc).__name__)).inc()
            raise

    def write_all(self, key: ObjectKey, workload: JobRecord | None, writes: list[Write], deletes: dict[Ident, str | None],
                  expectations: Expectations) -> None:
        """The workload's writes and deletes at once (a new workload's objects in one round trip), each answer expected
        in the cache; raises the first failure once every one is done."""
        calls: list[tuple[Ident, Callable[[Written], None]]] = [
            *(((d["kind"], d["metadata"]["name"]), lambda out, d=d, c=c, t=t: self.ensure(workload, d, c, t, out)) for d, c, t in writes),
            *((ident, lambda out, i=ident, u=uid: self.delete(key.namespace, i, u, out)) for ident, uid in deletes.items()),
        ]
        expectations.sending(key, [ident for ident, _ in calls])
        written: Written = {}
        try:
            if len(calls) == 1:
                calls[0][1](written)
            elif calls:
                futures = [self._pool.submit(call, written) for _, call in calls]
                errors = [error for f in futures if (error := f.exception()) is not None]
                if errors:
                    raise errors[0]
        finally:
            expectations.sent(key, written)

    def delete(self, namespace: str, ident: Ident, uid: str | None, written: Written) -> None:
        kind, name = ident
        answer = self._call("delete", kind, lambda: self.rest.delete(OWNED[kind], namespace, name, uid))
        if answer is not None:
            self.metrics.writes.labels(kind, "delete").inc()
            log.info("deleted %s %s/%s: its workload no longer wants it", kind, namespace, name)
        # Gone (a 404 too), or held by a finalizer: then the cache shows it terminating, at the answer's version.
        terminating = answer is not None and (answer.get("metadata") or {}).get("deletionTimestamp")
        written[ident] = resource_version(answer) if terminating else GONE

    def ensure(self, workload: JobRecord | None, desired: dict[str, Any], current: dict[str, Any] | None, todo: Changes | None,
               written: Written) -> None:
        """Create or bring up to date one object; its version written goes in ``written``."""
        kind, meta = desired["kind"], desired["metadata"]
        namespace, name, resource = meta["namespace"], meta["name"], OWNED[kind]
        ident = (kind, name)
        if current is None:
            # Not in our cache: absent, or there without our label (the cache holds only labelled
            # objects). A POST makes it only if no object of that name exists.
            try:
                stored = self._call("create", kind, lambda: self.rest.create(resource, namespace, desired, FIELD_MANAGER))
            except ApiException as exc:
                if exc.status != 409:
                    raise
                live = self._call("get", kind, lambda: self.rest.get(resource, namespace, name))
                if live is not None and not managed(live):
                    log.info("%s %s/%s exists and is not managed by us; left alone", kind, namespace, name)
                    if workload is not None:
                        self.events.warn(workload, "ResourceNotManaged", name, f"{kind} {name} exists without the label {MANAGED_SELECTOR}; left as it is")
                    return
                # Not booked as written: the version read is not ours, and the cache compares it when it comes.
                raise CacheBehind(f"{kind} {namespace}/{name} exists, not yet in the cache") from None
            self.metrics.writes.labels(kind, "create").inc()
            # Routine, at debug (at info, logging a new workload's creates costs real CPU); a repair is news.
            log.debug("created %s %s/%s", kind, namespace, name)
            written[ident] = resource_version(stored)
            return
        if not todo:
            return
        if todo.remove:
            patch = todo.removal_patch()
            stored = self._call("patch", kind, lambda: self.rest.merge_patch(resource, namespace, name, patch, FIELD_MANAGER))
            written[ident] = resource_version(stored)
            log.info("removed %s from %s %s/%s", ", ".join(".".join(p) for p in todo.remove), kind, namespace, name)
            if not changes(OwnedRecord(stored).object(), digested(desired)).apply:
                self.metrics.writes.labels(kind, "update").inc()
                return
        body = self._hydrated(desired)
        stored = self._call("apply", kind, lambda: self.rest.apply(resource, body, FIELD_MANAGER))
        written[ident] = resource_version(stored)
        self.metrics.writes.labels(kind, "update").inc()
        log.info("updated %s %s/%s", kind, namespace, name)

    def _hydrated(self, desired: dict[str, Any]) -> dict[str, Any]:
        """``desired`` with each :class:`Digest` a plugin kept (an SSH key) replaced by the live value,
        which the cache does not hold; :class:`CacheBehind` when the live object is not what was kept."""
        if not has_digests(desired):
            return desired
        kind, meta = desired["kind"], desired["metadata"]
        live = self._call("get", kind, lambda: self.rest.get(OWNED[kind], meta["namespace"], meta["name"])) or {}
        out = dict(desired)
        for field in ("data", "binaryData"):
            values = desired.get(field)
            if isinstance(values, dict):
                found = live.get(field) or {}
                if any(isinstance(v, Digest) and (not isinstance(found.get(k), str) or digest(found[k]) != v) for k, v in values.items()):
                    raise CacheBehind(f"{kind} {meta['namespace']}/{meta['name']} changed, not yet in the cache")
                out[field] = {k: found[k] if isinstance(v, Digest) else v for k, v in values.items()}
        return out
