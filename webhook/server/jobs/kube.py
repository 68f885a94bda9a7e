"""The cluster as a job source: the informer's cache, with a live GET on a miss."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from kubernetes import client

from volcano_job_webhook.kube.informer import Informer
from volcano_job_webhook.kube.records import JobRecord
from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, WORKLOADS, Kind

from . import NamespaceNotWatched, WorkloadKey


class KubeJobSource:
    """The informer's cache of the cluster's Volcano Jobs, with a live GET, one for every Pod asking
    at once, on a miss (a Job's first Pod may come before its watch event), for a held Job of another
    uid than the Pod's owner, and for Indexed Jobs and JobSets. A GET's answer stays out of the
    informer's cache: reused for ``lookup_ttl`` seconds (a 404 for ``not_found_ttl``, for lookups
    naming no uid), at most ``max_fetched`` of them."""

    def __init__(self, api: client.ApiClient, namespaces: Iterable[str] = (), get_timeout: float = 2.0,
                 *, lookup_ttl: float = 5.0, not_found_ttl: float = 1.0, max_fetched: int = 10_000,
                 max_decoded: int = 256, on_synced: Callable[[], None] | None = None) -> None:
        self.informer: Informer[JobRecord] = Informer(api, VOLCANO_JOB, namespaces, transform=JobRecord, on_synced=on_synced)
        self.rest = Rest(api, timeout=get_timeout)
        self.lookup_ttl = lookup_ttl
        self.not_found_ttl = not_found_ttl
        self.max_fetched = max_fetched
        self.watched = frozenset(ns for ns in self.informer.namespaces if ns)  # empty: every namespace
        self._fetched: OrderedDict[WorkloadKey, tuple[float, dict[str, Any] | None]] = OrderedDict()
        self._inflight: dict[WorkloadKey, asyncio.Future[dict[str, Any] | None]] = {}
        # A held Job as a dict, decoded once per version (a record is one version) while its Pods come
        # in; the most recently used few are kept.
        self._decoded: Callable[[JobRecord], dict[str, Any]] = functools.lru_cache(max_decoded)(JobRecord.object)

    def start(self) -> None:
        self.informer.start()

    def stop(self) -> None:
        self.informer.stop()

    @property
    def ready(self) -> bool:
        return self.informer.synced

    def __len__(self) -> int:
        return len(self.informer)

    def status(self) -> dict[str, Any]:
        # Still ready while the API server is away (the cache keeps answering), but say so.
        return {"source": "kube", "apiServer": "reachable" if self.informer.connected else "unreachable"}

    async def get(self, namespace: str, name: str, uid: str | None = None, kind: Kind = VOLCANO_JOB) -> dict[str, Any] | None:
        if self.watched and namespace not in self.watched:
            raise NamespaceNotWatched(namespace)
        if kind not in WORKLOADS:
            raise ValueError(f"not a workload kind: {kind!r}")
        if kind is VOLCANO_JOB:
            record = self.informer.get(namespace, name)
            if record is not None and (uid is None or record.uid == uid) and not record.finished:
                return self._decoded(record)
        # Not held, a finished Job (kept as its identity only: its Pods are all made), another
        # Job of the same name, or another kind: the API server is asked.
        key = (kind, namespace, name)
        fetched = self._fetched.get(key)
        if fetched is not None:
            expires, job = fetched
            if time.monotonic() >= expires:
                del self._fetched[key]
            elif job is not None and (uid is None or (job.get("metadata") or {}).get("uid") == uid):
                return job
            elif job is None and uid is None:
                return None
        task = self._inflight.get(key)
        if task is None:
            # A task of its own, so a requester that goes away does not cancel the others' GET.
            task = asyncio.get_running_loop().create_task(self._fetch(key))
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._finished(key, done))
        return await asyncio.shield(task)

    def _finished(self, key: WorkloadKey, task: asyncio.Task[dict[str, Any] | None]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here too: every requester may have gone

    async def _fetch(self, key: WorkloadKey) -> dict[str, Any] | None:
        """The GET, its answer (None: 404) remembered for its ttl."""
        job = await asyncio.to_thread(self.rest.get, *key)
        ttl = self.lookup_ttl if job is not None else self.not_found_ttl
        if ttl <= 0:
            self._fetched.pop(key, None)
            return job
        self._fetched[key] = (time.monotonic() + ttl, job)
        self._fetched.move_to_end(key)
        while len(self._fetched) > self.max_fetched:
            self._fetched.popitem(last=False)
        return job
