"""Warning Events on a Job, so ``kubectl describe`` says why its objects are not as asked — client-go's
``EventRecorder`` for the few reasons the reconciler has, each said once per Job and message."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime

from volcano_job_webhook.kube.backoff import describe
from volcano_job_webhook.kube.records import JobRecord
from volcano_job_webhook.kube.rest import Rest
from volcano_job_webhook.plugins.kinds import ObjectKey

from .metrics import ReconcilerMetrics
from .owned import EVENT

log = logging.getLogger(__name__)
COMPONENT = "volcano-job-webhook-reconciler"


class EventRecorder:
    """Records Warning Events on workloads; a warning already said on one (by uid) with the same message
    is not said again — a workload's status changes many times while its Pods start, none of it news."""

    def __init__(self, rest: Rest, metrics: ReconcilerMetrics) -> None:
        self.rest = rest
        self.metrics = metrics
        # What was said, by (workload's key, reason, subject): the workload's kind and uid with the message.
        self._said: dict[tuple[ObjectKey, str, str], str] = {}
        self._lock = threading.Lock()

    def warn(self, workload: JobRecord, reason: str, subject: str, message: str) -> None:
        namespace, name = workload.key
        said = f"{workload.kind}\0{workload.uid}\0{message}"  # an Indexed Job and a Volcano Job may share a name
        with self._lock:
            if self._said.get((workload.key, reason, subject)) == said:
                return
            self._said[(workload.key, reason, subject)] = said
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": EVENT.api_version, "kind": EVENT.kind,
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"apiVersion": workload.api_version, "kind": workload.kind, "name": name, "namespace": namespace,
                               "uid": workload.uid, "resourceVersion": str(workload.version)},
            "reason": reason, "message": message[:1024], "type": "Warning",
            "source": {"component": COMPONENT},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self.metrics.api_requests.labels("create", EVENT.kind).inc()
            self.rest.create(EVENT, namespace, body)
        except Exception as exc:
            log.info("could not record event %s on %s %s/%s: %s", reason, workload.kind, namespace, name, describe(exc))

    def clear(self, key: ObjectKey) -> None:
        """The workload is gone: what was said of it may be said again of one of that name."""
        with self._lock:
            for said in [s for s in self._said if s[0] == key]:
                del self._said[said]
