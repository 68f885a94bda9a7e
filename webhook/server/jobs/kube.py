"""The cluster as a job source: the informer's cache, with a live GET on a miss."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from volcano_job_webhook.kube.informer import JobInformer
from volcano_job_webhook.plugins.keys import JOB_GROUP, JOB_PLURAL, JOB_VERSION


class KubeJobSource:
    """The webhook's view of the cluster's Jobs: the informer's cache, with a live GET on a miss (a Job
    created a moment ago may reach us through its first Pod before its watch event)."""

    def __init__(self, api: client.ApiClient, namespaces: Iterable[str] = (), get_timeout: float = 2.0) -> None:
        self.informer = JobInformer(api, namespaces)
        self.custom = client.CustomObjectsApi(api)
        self.get_timeout = get_timeout

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

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        cached = self.informer.get(namespace, name)
        if cached is not None:
            return cached
        try:
            job = await asyncio.to_thread(
                self.custom.get_namespaced_custom_object, JOB_GROUP, JOB_VERSION, namespace, JOB_PLURAL, name,
                _request_timeout=self.get_timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        self.informer.store(job)
        return job
