"""The reconciler's writes: one object brought to what a job wants, or deleted — and a job's writes
sent at once.

A POST makes what is missing (it never takes over an object of the same name someone else made);
server-side apply repairs what drifted, after a merge patch removes what our field manager set and
no longer wants; a delete is conditional on the uid the cache held. What the API server answers goes
into the cache at once (so the watch event of our own write changes nothing) unless the watch
changed the object while the request was out, and is reported as the version written. Every attempt, retries included, first asks whether this replica may still
write (``may_write``: leading, not stopping): a replica that lost the Lease while backing off
raises :class:`~.controller.NotLeading` instead of writing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.backoff import with_retries
from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.kube.records import JobRecord, Version, digest, digested, has_digests, resource_version
from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.plugins.base import Digest

from .compare import Changes, changes
from .controller import NotLeading
from .events import EventRecorder
from .kinds import FIELD_MANAGER, MANAGED_SELECTOR, OWNED, OwnedRecord, managed
from .metrics import ReconcilerMetrics

log = logging.getLogger(__name__)

READS = frozenset({"get", "list"})
Ident = tuple[str, str]  # (kind, name)
Write = tuple[dict[str, Any], dict[str, Any] | None, Changes | None]  # desired, as cached, what to do


class CacheBehind(Exception):
    """The API server holds something the cache did not (it holds it now): the reconcile starts over.
    ``stale`` names an object whose kept state (a deleted Secret's) cannot be written back."""

    def __init__(self, stale: Ident | None = None) -> None:
        super().__init__(stale)
        self.stale = stale


class ObjectWriter:
    def __init__(self, rest: Rest, caches: Mapping[str, Informer[OwnedRecord]], metrics: ReconcilerMetrics,
                 events: EventRecorder, may_write: Callable[[], bool], threads: int) -> None:
        self.rest = rest
        self.caches = caches
        self.metrics = metrics
        self.events = events
        self.may_write = may_write
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reconcile-write")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def api(self, verb: str, kind: str, fn: Callable[[], Any]) -> Any:
        def count(exc: BaseException) -> None:
            self.metrics.api_errors.labels(str(getattr(exc, "status", None) or type(exc).__name__)).inc()

        def attempt() -> Any:
            # Asked before every attempt, retries included: a replica that lost the Lease while
            # backing off must not write after its renew deadline.
            if verb not in READS and not self.may_write():
                raise NotLeading(f"{verb} of a {kind}: no longer the leader")
            self.metrics.api_requests.labels(verb, kind).inc()
            return fn()

        return with_retries(attempt, on_error=count)

    def delete(self, kind: str, namespace: str, name: str, uid: str | None) -> bool:
        deleted = bool(self.api("delete", kind, lambda: self.rest.delete(OWNED[kind], namespace, name, uid)))
        if deleted:
            self.metrics.writes.labels(kind, "delete").inc()
        self.caches[kind].forget(namespace, name)  # gone either way (a 404 too)
        return deleted

    def write_all(self, job: JobRecord, writes: list[Write]) -> dict[Ident, Version]:
        """The job's writes, at once: they are independent, and a new job's objects then take one
        round trip to the API server rather than one each. Returns the versions written."""
        if len(writes) <= 1:
            return dict(w for desired, current, todo in writes if (w := self.ensure(job, desired, current, todo)))
        futures = [self._pool.submit(self.ensure, job, desired, current, todo) for desired, current, todo in writes]
        errors = [f.exception() for f in futures]
        for error in errors:
            if isinstance(error, CacheBehind):
                raise error
        for error in errors:
            if error is not None:
                raise error
        return dict(w for f in futures if (w := f.result()))

    def ensure(self, job: JobRecord, desired: dict[str, Any], current: dict[str, Any] | None,
               todo: Changes | None) -> tuple[Ident, Version] | None:
        """Create or update one object; returns its (kind, name) and the version written, if any."""
        kind, meta = desired["kind"], desired["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        resource, cache = OWNED[kind], self.caches[kind]
        since = cache.position()  # what the watch has said before any answer of ours comes back
        if current is None:
            # Not in our cache: absent, made a moment ago, or there without our label (the cache
            # holds only labelled objects). A POST makes it only if no object of that name exists.
            if not self.may_write():
                return None
            if has_digests(desired):
                # Kept from a deleted object whose value the cache never held: made anew instead.
                raise CacheBehind(stale=(kind, name))
            try:
                stored = self.api("create", kind, lambda: self.rest.create(resource, namespace, desired, FIELD_MANAGER))
            except ApiException as exc:
                if exc.status != 409:
                    raise
                live = self.api("get", kind, lambda: self.rest.get(resource, namespace, name))
                if live is None:
                    raise CacheBehind() from None  # deleted meanwhile: start over
                if not managed(live):
                    log.info("%s %s/%s exists and is not managed by us; left alone", kind, namespace, name)
                    self.events.warn(job, "ResourceNotManaged", name, f"{kind} {name} exists without the label {MANAGED_SELECTOR}; left as it is")
                    return None
                # Ours, and the cache is behind: start over with it (an SSH Secret keeps its keys).
                cache.store(live, since)
                raise CacheBehind() from None
            cache.store(stored, since)
            self.metrics.writes.labels(kind, "create").inc()
            # Four lines for every new job, a tenth of the reconciler's CPU at info: routine, so debug; a
            # repair below is news, at info.
            log.debug("created %s %s/%s", kind, namespace, name)
            return (kind, name), resource_version(stored)
        if not todo or not self.may_write():
            return None
        if todo.remove:
            patch = todo.removal_patch()
            stored = self.api("patch", kind, lambda: self.rest.merge_patch(resource, namespace, name, patch, FIELD_MANAGER))
            cache.store(stored, since)
            log.info("removed %s from %s %s/%s", ", ".join(".".join(p) for p in todo.remove), kind, namespace, name)
            if not changes(OwnedRecord(stored).object(), digested(desired)).apply:
                self.metrics.writes.labels(kind, "update").inc()
                return (kind, name), resource_version(stored)
        body = self._hydrated(desired)
        stored = self.api("apply", kind, lambda: self.rest.apply(resource, body, FIELD_MANAGER))
        cache.store(stored, since)
        self.metrics.writes.labels(kind, "update").inc()
        log.info("updated %s %s/%s", kind, namespace, name)
        return (kind, name), resource_version(stored)

    def _hydrated(self, desired: dict[str, Any]) -> dict[str, Any]:
        """``desired`` with every :class:`Digest` a plugin kept (an SSH key: "keep what is there")
        replaced by the live value it stands for, read from the API server — the one value the
        cache does not hold. Starts the reconcile over when the live object is not what was kept."""
        if not has_digests(desired):
            return desired
        kind, meta = desired["kind"], desired["metadata"]
        since = self.caches[kind].position()
        live = self.api("get", kind, lambda: self.rest.get(OWNED[kind], meta["namespace"], meta["name"]))
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
                        if live is not None:
                            self.caches[kind].store(live, since)
                        raise CacheBehind(stale=(kind, meta["name"]))
                    value = found[key]
                filled[key] = value
            out[field] = filled
        return out
