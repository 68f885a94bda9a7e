"""The two admission decisions, free of HTTP: wire a Pod (``/mutate``), check a Job (``/validate``).

Each is a :class:`Handler` — one ``async __call__(request) -> response``, the shape of
controller-runtime's ``admission.Handler``. Data flows one way: request, job lookup, plugin chain,
patch, response. Neither has side effects, so ``dryRun`` requests get the same answer as real ones.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from volcano_job_webhook.limits import MAX_DEPTH, nested_deeper_than
from volcano_job_webhook.plugins import Chain, Job, PluginError, PreparedJob
from volcano_job_webhook.plugins.keys import JOB_GROUP, JOB_KIND, JOB_NAME_KEY

from .jobs import JobSource, NamespaceNotWatched
from .metrics import WebhookMetrics
from .patch import make_patch
from .review import AdmissionRequest, AdmissionResponse
from .shape import pod_shape_problem

log = logging.getLogger(__name__)

__all__ = ["Handler", "JobCache", "JobValidator", "PodMutator"]


class Handler(Protocol):
    """Decides one AdmissionReview."""

    async def __call__(self, request: AdmissionRequest, /) -> AdmissionResponse: ...


class JobCache:
    """Jobs prepared for the chain, keyed by ``(uid, resourceVersion)``, least recently used out.

    Every Pod of a job reuses one :class:`PreparedJob` (plugins built, arguments parsed, names
    checked) until the Job changes; a Job without both keys (a file with no uid) is keyed by its
    namespace and name and the identity of the object its source returned, which stays the same
    until the file changes.
    """

    def __init__(self, chain: Chain, size: int = 4096) -> None:
        self.chain = chain
        self.size = size
        self._entries: OrderedDict[tuple[Any, ...], PreparedJob] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def prepared(self, raw: Mapping[str, Any]) -> PreparedJob:
        """The prepared job for ``raw``; raises :class:`PluginError` when it cannot be prepared."""
        key = _snapshot_key(raw)
        prepared = self._entries.get(key)
        if prepared is not None:
            self._entries.move_to_end(key)
            return prepared
        if nested_deeper_than(raw):
            meta = _object_meta(raw)
            raise PluginError(f"{meta.get('namespace') or 'default'}/{meta.get('name')}", "", "job",
                              f"nested more than {MAX_DEPTH} levels deep")
        prepared = self.chain.prepare(Job.from_object(raw))
        self._entries[key] = prepared
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return prepared


def _snapshot_key(raw: Mapping[str, Any]) -> tuple[Any, ...]:
    meta = _object_meta(raw)
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if uid and version:
        return (uid, version)
    # Holding no reference to ``raw``, its id could be reused; the name keeps two sources' objects apart,
    # and a source hands out one object per file version (DirectoryJobSource keeps it alive).
    return (meta.get("namespace"), meta.get("name"), id(raw))


def _object_meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


class PodMutator:
    """Wires a Pod of a Volcano job. Anything that is not the CREATE of a labelled Pod passes unchanged;
    a Pod whose job cannot be found passes unchanged with a warning (never blocked for it)."""

    def __init__(self, source: JobSource, jobs: JobCache, metrics: WebhookMetrics) -> None:
        self.source = source
        self.jobs = jobs
        self.metrics = metrics

    async def __call__(self, req: AdmissionRequest) -> AdmissionResponse:
        if req.kind.kind != "Pod" or req.kind.group or req.operation != "CREATE" or req.sub_resource:
            return AdmissionResponse.allow("ignored")
        pod = req.object
        if not isinstance(pod, Mapping) or (pod.get("kind") not in (None, "Pod")):
            return AdmissionResponse.deny("request.object: missing or not a Pod", code=400, result="bad-request")
        if nested_deeper_than(pod):
            return _too_deep()
        meta = _object_meta(pod)
        labels = meta.get("labels")
        job_name = labels.get(JOB_NAME_KEY) if isinstance(labels, Mapping) else None
        if not job_name:
            return AdmissionResponse.allow("ignored")
        if not isinstance(job_name, str):
            return AdmissionResponse.deny(f"label {JOB_NAME_KEY} must be a string", code=400, result="bad-request")
        problem = pod_shape_problem(pod)  # type: ignore[arg-type]
        if problem is not None:
            return AdmissionResponse.deny(f"request.object.{problem}", code=400, result="bad-request")
        namespace = req.namespace or str(meta.get("namespace") or "default")
        context = {"uid": req.uid, "namespace": namespace, "pod": meta.get("name") or req.name, "job": job_name}

        lookups = self.metrics.lookups
        try:
            raw_job = await self.source.get(namespace, job_name)
        except NamespaceNotWatched:
            lookups.labels("not_watched").inc()
            log.warning("namespace not watched; Pod passes unchanged", extra=context)
            return AdmissionResponse.allow(
                "no-job", [f"volcano-job-webhook: namespace {namespace} is not watched by this webhook (--namespace): "
                           f"Pod of job {job_name} not wired"]
            )
        except Exception as exc:  # the API server may be away; the Pod must not be blocked for it
            lookups.labels("error").inc()
            log.warning("job lookup failed: %s", exc, extra=context)
            return AdmissionResponse.allow(
                "no-job", [f"volcano-job-webhook: could not look up job {namespace}/{job_name}: Pod not wired"]
            )
        if raw_job is None:
            lookups.labels("not_found").inc()
            log.warning("job not found; Pod passes unchanged", extra=context)
            return AdmissionResponse.allow(
                "no-job", [f"volcano-job-webhook: job {namespace}/{job_name} not found: Pod not wired by its plugins"]
            )
        lookups.labels("found").inc()

        try:
            result = self.jobs.prepared(raw_job).mutate(dict(pod))
        except PluginError as exc:
            log.info("Pod denied: %s", exc, extra={**context, "result": "denied"})
            return AdmissionResponse.deny(str(exc))
        patch = make_patch(pod, result.pod)
        if not patch:
            return AdmissionResponse.allow("unchanged", result.warnings)
        for plugin in result.plugins:
            self.metrics.patches.labels(plugin).inc()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("Pod patched", extra={**context, "plugins": result.plugins})
        return AdmissionResponse(allowed=True, patch=patch, warnings=result.warnings, result="patched")


def _too_deep() -> AdmissionResponse:
    return AdmissionResponse.deny(f"request.object: nested more than {MAX_DEPTH} levels deep", code=400, result="bad-request")


class JobValidator:
    """Denies a Volcano Job whose plugins would fail, with the message its Pods would get."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain

    async def __call__(self, req: AdmissionRequest) -> AdmissionResponse:
        if req.kind.group != JOB_GROUP or req.kind.kind != JOB_KIND or req.operation not in ("CREATE", "UPDATE"):
            return AdmissionResponse.allow("ignored")
        if not isinstance(req.object, Mapping):
            return AdmissionResponse.deny("request.object: missing or not a Volcano Job", code=400, result="bad-request")
        if nested_deeper_than(req.object):
            return _too_deep()
        obj = dict(req.object)
        meta = _object_meta(obj)
        if req.namespace and not meta.get("namespace"):
            # A namespaced CREATE may leave the namespace to the request.
            obj["metadata"] = {**meta, "namespace": req.namespace}
        try:
            warnings = self.chain.check(Job.from_object(obj))
        except PluginError as exc:
            return AdmissionResponse.deny(str(exc))
        return AdmissionResponse.allow("allowed", warnings)
