"""The two admission decisions, free of HTTP: wire a Pod (``/mutate``), check a Job (``/validate``).

Data flows one way: request → job lookup → plugin chain → patch → response. Neither handler has side
effects, so ``dryRun`` requests get the same answer as real ones.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from volcano_job_webhook.plugins import Chain, Job, PluginError
from volcano_job_webhook.plugins.pod import JOB_NAME_KEY

from .admission import AdmissionRequest, AdmissionResponse
from .jobsource import JobSource
from .metrics import WebhookMetrics
from .patch import make_patch

log = logging.getLogger(__name__)

JOB_GROUP = "batch.volcano.sh"


class JobCache:
    """Parsed Jobs, keyed by the identity of the object the job source returned.

    Sources hand out the same object until the Job changes, so every Pod of a job reuses one
    :class:`Job` — and with it the chain's per-job preparation (plugins built, arguments parsed,
    names checked). The raw object is kept with its entry, so its ``id`` cannot be reused.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._entries: OrderedDict[int, tuple[Mapping[str, Any], Job]] = OrderedDict()

    def job(self, raw: Mapping[str, Any]) -> Job:
        entry = self._entries.get(id(raw))
        if entry is not None and entry[0] is raw:
            self._entries.move_to_end(id(raw))
            return entry[1]
        job = Job.from_object(raw)
        self._entries[id(raw)] = (raw, job)
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return job


def _object_meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


async def mutate_pod(
    req: AdmissionRequest, source: JobSource, chain: Chain, metrics: WebhookMetrics, jobs: JobCache
) -> AdmissionResponse:
    """Wire a Pod of a Volcano job. Anything that is not the CREATE of a labelled Pod passes unchanged."""
    if req.kind.kind != "Pod" or req.kind.group or req.operation != "CREATE" or req.sub_resource:
        return AdmissionResponse.allow("ignored")
    pod = req.object
    if not isinstance(pod, Mapping) or (pod.get("kind") not in (None, "Pod")):
        return AdmissionResponse.deny("request.object: missing or not a Pod", code=400, result="bad-request")
    labels = _object_meta(pod).get("labels")
    job_name = labels.get(JOB_NAME_KEY) if isinstance(labels, Mapping) else None
    if not job_name:
        return AdmissionResponse.allow("ignored")
    if not isinstance(job_name, str):
        return AdmissionResponse.deny(f"label {JOB_NAME_KEY} must be a string", code=400, result="bad-request")
    namespace = req.namespace or str(_object_meta(pod).get("namespace") or "default")
    context = {"uid": req.uid, "namespace": namespace, "pod": _object_meta(pod).get("name") or req.name, "job": job_name}

    try:
        raw_job = await source.get(namespace, job_name)
    except Exception as exc:  # the API server may be away; the Pod must not be blocked for it
        metrics.lookups.labels("error").inc()
        log.warning("job lookup failed: %s", exc, extra=context)
        return AdmissionResponse.allow(
            "no-job", [f"volcano-job-webhook: could not look up job {namespace}/{job_name}: Pod not wired"]
        )
    if raw_job is None:
        metrics.lookups.labels("not_found").inc()
        log.warning("job not found; Pod passes unchanged", extra=context)
        return AdmissionResponse.allow(
            "no-job", [f"volcano-job-webhook: job {namespace}/{job_name} not found: Pod not wired by its plugins"]
        )
    metrics.lookups.labels("found").inc()

    try:
        job = jobs.job(raw_job)
        result = chain.mutate(job, dict(pod))
    except PluginError as exc:
        log.info("Pod denied: %s", exc, extra={**context, "result": "denied"})
        return AdmissionResponse.deny(str(exc))
    patch = make_patch(pod, result.pod)
    if not patch:
        return AdmissionResponse.allow("unchanged", result.warnings)
    for plugin in result.plugins:
        metrics.patches.labels(plugin).inc()
    log.debug("Pod patched", extra={**context, "plugins": result.plugins})
    return AdmissionResponse(allowed=True, patch=patch, warnings=result.warnings, result="patched")


async def validate_job(req: AdmissionRequest, chain: Chain) -> AdmissionResponse:
    """Deny a Volcano Job whose plugins would fail, with the message its Pods would get."""
    if req.kind.group != JOB_GROUP or req.kind.kind != "Job" or req.operation not in ("CREATE", "UPDATE"):
        return AdmissionResponse.allow("ignored")
    if not isinstance(req.object, Mapping):
        return AdmissionResponse.deny("request.object: missing or not a Volcano Job", code=400, result="bad-request")
    obj = dict(req.object)
    meta = _object_meta(obj)
    if req.namespace and not meta.get("namespace"):
        # A namespaced CREATE may leave the namespace to the request.
        obj["metadata"] = {**meta, "namespace": req.namespace}
    try:
        job = Job.from_object(obj)
        warnings = chain.check(job)
    except PluginError as exc:
        return AdmissionResponse.deny(str(exc))
    return AdmissionResponse.allow("allowed", warnings)
