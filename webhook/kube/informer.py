"""A watch-backed in-memory cache of Volcano Jobs, through the official ``kubernetes`` client.

:class:`JobInformer` lists the Jobs once, then watches from the list's ``resourceVersion``; a watch
that ends is resumed from the last version seen, and a ``410 Gone`` (history compacted) starts over
with a fresh list, whose difference from the cache is reported as events, so no deletion is missed
while disconnected. Errors back off exponentially with jitter. It serves the webhook
(:class:`KubeJobSource`) and the reconciler (``on_event``) alike.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from volcano_job_webhook.plugins.keys import JOB_GROUP, JOB_PLURAL, JOB_VERSION, JobKey

from .backoff import Backoff

log = logging.getLogger(__name__)

EventHandler = Callable[[str, dict[str, Any]], None]


def _key(obj: dict[str, Any]) -> JobKey:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "default", meta.get("name") or "")


class JobInformer:
    """List-then-watch of Volcano Jobs in all namespaces or the ones given, one thread each.

    ``on_event(type, job)`` is called from the informer's threads with ``ADDED``, ``MODIFIED`` or
    ``DELETED`` for every change, including those found by a re-list.
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespaces: Iterable[str] = (),
        on_event: EventHandler | None = None,
        watch_timeout: int = 300,
    ) -> None:
        self.api = client.CustomObjectsApi(api)
        self.namespaces = list(namespaces) or [""]
        self.on_event = on_event
        self.watch_timeout = watch_timeout
        self._jobs: dict[JobKey, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._synced: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._watches: list[watch.Watch] = []
        self.relists = 0
        # False from a failed list or watch until the next one succeeds: the API server is away.
        self.connected = False

    # Cache reads ---------------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return len(self._synced) == len(self.namespaces)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._jobs.get((namespace, name))

    def jobs(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._jobs.values())

    def __len__(self) -> int:
        return len(self._jobs)

    def store(self, job: dict[str, Any]) -> None:
        """Insert a Job fetched outside the watch (a live GET), unless the cache has a newer one."""
        key = _key(job)
        with self._lock:
            current = self._jobs.get(key)
            if current is None or _rv(current) <= _rv(job):
                self._jobs[key] = job

    # Lifecycle -----------------------------------------------------------------------------------

    def start(self) -> None:
        for namespace in self.namespaces:
            thread = threading.Thread(target=self._run, args=(namespace,), name=f"job-informer-{namespace or 'all'}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.stop()
            # Watch.stop() is only seen after the next event; closing the stream ends the read now.
            response = getattr(w, "_resp", None)
            if response is not None:
                try:
                    response.close()
                except Exception:
                    pass
        for thread in self._threads:
            thread.join(timeout)

    # The loop ------------------------------------------------------------------------------------

    def _list(self, namespace: str) -> tuple[list[dict[str, Any]], str]:
        if namespace:
            result = self.api.list_namespaced_custom_object(JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, _request_timeout=30)
        else:
            result = self.api.list_cluster_custom_object(JOB_GROUP, JOB_VERSION, JOB_PLURAL, _request_timeout=30)
        return result.get("items") or [], (result.get("metadata") or {}).get("resourceVersion") or ""

    def _replace(self, namespace: str, items: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """Swap in a fresh list for one namespace (or all); return the events it implies."""
        fresh = {_key(job): job for job in items}
        events: list[tuple[str, dict[str, Any]]] = []
        with self._lock:
            for key, old in list(self._jobs.items()):
                if (not namespace or key[0] == namespace) and key not in fresh:
                    del self._jobs[key]
                    events.append(("DELETED", old))
            for key, job in fresh.items():
                old = self._jobs.get(key)
                if old is None:
                    events.append(("ADDED", job))
                elif _rv(old) != _rv(job):
                    events.append(("MODIFIED", job))
                self._jobs[key] = job
        return events

    def _apply(self, kind: str, job: dict[str, Any]) -> None:
        with self._lock:
            if kind == "DELETED":
                self._jobs.pop(_key(job), None)
            else:
                self._jobs[_key(job)] = job

    def _emit(self, kind: str, job: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(kind, job)
        except Exception:
            log.exception("job event handler failed for %s/%s", *_key(job))

    def _run(self, namespace: str) -> None:
        backoff = Backoff()
        resource_version = ""
        while not self._stop.is_set():
            try:
                if not resource_version:
                    items, resource_version = self._list(namespace)
                    self.relists += 1
                    for kind, job in self._replace(namespace, items):
                        self._emit(kind, job)
                    self._synced.add(namespace)
                    self.connected = True
                    log.info("listed %d jobs in %s", len(items), namespace or "all namespaces")
                resource_version = self._watch(namespace, resource_version)
                backoff.reset()
            except ApiException as exc:
                self.connected = exc.status == 410
                if exc.status == 410:
                    log.info("job watch expired (410 Gone); listing again")
                    resource_version = ""
                    continue
                delay = backoff.next_delay()
                log.warning("job list/watch failed (HTTP %s); listing again in %.1fs", exc.status, delay)
                resource_version = ""
                self._stop.wait(delay)
            except Exception as exc:  # connection errors: urllib3, socket, protocol
                self.connected = False
                delay = backoff.next_delay()
                log.warning("job list/watch failed (%s); listing again in %.1fs", type(exc).__name__, delay)
                # A fresh list, rather than resuming the watch, proves the server is back and
                # reports anything deleted meanwhile.
                resource_version = ""
                self._stop.wait(delay)

    def _watch(self, namespace: str, resource_version: str) -> str:
        """Stream events until the watch ends; return the last resourceVersion seen."""
        w = watch.Watch()
        self._watches.append(w)
        try:
            if namespace:
                func: Any = self.api.list_namespaced_custom_object
                args: tuple[Any, ...] = (JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL)
            else:
                func, args = self.api.list_cluster_custom_object, (JOB_GROUP, JOB_VERSION, JOB_PLURAL)
            for event in w.stream(
                func, *args,
                resource_version=resource_version,
                timeout_seconds=self.watch_timeout,
                allow_watch_bookmarks=True,
                _request_timeout=self.watch_timeout + 30,
            ):
                if self._stop.is_set():
                    break
                self.connected = True
                kind, obj = event["type"], event["object"]
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    resource_version = rv
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._apply(kind, obj)
                    self._emit(kind, obj)
        finally:
            self._watches.remove(w)
        return resource_version


def _rv(obj: dict[str, Any]) -> int:
    text = (obj.get("metadata") or {}).get("resourceVersion") or "0"
    return int(text) if text.isdigit() else 0
