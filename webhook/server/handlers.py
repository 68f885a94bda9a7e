"""The two admission decisions, free of HTTP: wire a Pod (``/mutate``), check a Job (``/validate``),
each a :class:`Handler` as controller-runtime's ``admission.Handler``; neither has side effects, so
``dryRun`` requests get the same answer."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from volcano_job_webhook.kube.backoff import describe
from volcano_job_webhook.limits import MAX_DEPTH, nested_deeper_than
from volcano_job_webhook.plugins import Chain, PluginError, PreparedJob, read_workload
from volcano_job_webhook.plugins.keys import ENV_PLACEMENT_ANNOTATION, OPT_IN_LABEL, PLUGINS_ANNOTATION
from volcano_job_webhook.plugins.kinds import BATCH_JOB, JOBSET, POD, VOLCANO_JOB, WORKLOADS, Kind, by_group_kind, controller_of, kind_of
from volcano_job_webhook.plugins.pod import metadata
from volcano_job_webhook.plugins.workloads import jobset_child, require_opt_in

from .admission import AdmissionRequest, AdmissionResponse
from .jobs import JobSource, NamespaceNotWatched
from .metrics import WebhookMetrics
from .patch import make_patch
from .shape import pod_shape_problem

log = logging.getLogger(__name__)

__all__ = ["Handler", "JobCache", "JobValidator", "PodMutator"]


class Handler(Protocol):
    """Decides one AdmissionReview."""

    async def __call__(self, request: AdmissionRequest, /) -> AdmissionResponse: ...


class JobCache:
    """One :class:`PreparedJob` per Job version, ``(uid, resourceVersion)``, shared by its Pods, least
    recently used out; a Job without both (a file's) is keyed by its name and the object's identity,
    which its source keeps until the file changes."""

    def __init__(self, chain: Chain, size: int = 4096) -> None:
        self.chain = chain
        self.size = size
        self._entries: OrderedDict[tuple[Any, ...], PreparedJob] = OrderedDict()

    def prepared(self, raw: Mapping[str, Any]) -> PreparedJob:
        """The prepared job for ``raw``; raises :class:`PluginError` when it cannot be prepared."""
        key = _snapshot_key(raw)
        prepared = self._entries.get(key)
        if prepared is not None:
            self._entries.move_to_end(key)
            return prepared
        if nested_deeper_than(raw):
            meta = metadata(raw)
            raise PluginError(f"{meta.get('namespace') or 'default'}/{meta.get('name')}", "", "job",
                              f"nested more than {MAX_DEPTH} levels deep")
        prepared = self.chain.prepare(read_workload(raw))
        self._entries[key] = prepared
        if len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return prepared


def _snapshot_key(raw: Mapping[str, Any]) -> tuple[Any, ...]:
    meta = metadata(raw)
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if uid and version:
        return (uid, version)
    # Holding no reference to ``raw``, its id could be reused; the name keeps two sources' objects apart,
    # and a source hands out one object per file version (DirectoryJobSource keeps it alive).
    return (meta.get("namespace"), meta.get("name"), id(raw))


def workload_of(pod: Mapping[str, Any]) -> tuple[Kind, Any, str | None] | None:
    """The workload ``pod`` belongs to (its kind, name and the uid the Pod names), by the labels of
    :data:`~kinds.WORKLOADS` in order (an Indexed Job's and a JobSet's Pods only when opted in); or None."""
    labels = metadata(pod).get("labels")
    if not isinstance(labels, Mapping):
        return None
    opted_in = labels.get(OPT_IN_LABEL) == "true"
    for kind in WORKLOADS:
        name = labels.get(kind.pod_label)
        if not name or (kind.opt_in and not opted_in):
            continue
        if kind.pod_uid_label:
            uid = labels.get(kind.pod_uid_label)
            return kind, name, uid if isinstance(uid, str) and uid else None
        owner = controller_of(pod)
        return kind, name, owner.uid if owner is not None and owner.kind is kind else None
    return None


class PodMutator:
    """Wires the CREATE of a workload's Pod with the plugins we run; anything else passes unchanged.
    Never silent: a failed lookup is an error (``failurePolicy`` applies, the controller retries), a
    Pod of a missing job passes with a warning, one we cannot wire is denied (warned, with ``audit``)."""

    def __init__(self, source: JobSource, jobs: JobCache, metrics: WebhookMetrics, *, audit: bool = False) -> None:
        self.source = source
        self.jobs = jobs
        self.metrics = metrics
        self.audit = audit

    async def __call__(self, req: AdmissionRequest) -> AdmissionResponse:
        if req.kind.kind != POD.kind or req.kind.group != POD.group or req.operation != "CREATE" or req.sub_resource:
            return AdmissionResponse.allow("ignored")
        pod = req.object
        if not isinstance(pod, Mapping) or (pod.get("kind") not in (None, "Pod")):
            return AdmissionResponse.deny("request.object: missing or not a Pod", code=400, result="bad-request")
        if nested_deeper_than(pod):
            return _too_deep()
        meta = metadata(pod)
        workload = workload_of(pod)
        if workload is None:
            if isinstance(meta.get("labels"), Mapping) and meta["labels"].get(OPT_IN_LABEL) == "true":
                # Opted in, but made by no workload we wire: said, not silently passed.
                return AdmissionResponse.allow("no-job", [
                    f"volcano-job-webhook: the Pod has {OPT_IN_LABEL}=true but no Indexed Job or JobSet labels "
                    f"({BATCH_JOB.pod_label}, {JOBSET.pod_label}): not wired"])
            return AdmissionResponse.allow("ignored")
        kind, job_name, owner = workload
        if not isinstance(job_name, str):
            return AdmissionResponse.deny("the Pod's job-name label must be a string", code=400, result="bad-request")
        problem = pod_shape_problem(pod)  # type: ignore[arg-type]
        if problem is not None:
            return AdmissionResponse.deny(f"request.object.{problem}", code=400, result="bad-request")
        namespace = req.namespace or str(meta.get("namespace") or "default")
        context = {"uid": req.uid, "namespace": namespace, "pod": meta.get("name") or req.name, "job": job_name}

        lookups = self.metrics.lookups
        noun = kind.noun
        try:
            raw_job = await self.source.get(namespace, job_name, owner, kind)
        except NamespaceNotWatched:
            lookups.labels("not_watched").inc()
            log.warning("namespace not watched; Pod passes unchanged", extra=context)
            return AdmissionResponse.allow(
                "no-job", [f"volcano-job-webhook: namespace {namespace} is not watched by this webhook (--namespace): "
                           f"Pod of job {job_name} not wired"]
            )
        except Exception as exc:
            # Not decided, rather than the Pod let through unwired: the failure policy decides, and
            # Volcano's controller creates the Pod again.
            lookups.labels("error").inc()
            log.warning("job lookup failed: %s", exc, extra=context)
            return AdmissionResponse.deny(
                f"volcano-job-webhook: could not look up {noun} {namespace}/{job_name} ({describe(exc)}); the Pod is not "
                "admitted unwired: create it again", code=500, result="error")
        uid = metadata(raw_job or {}).get("uid")
        if raw_job is None or (owner is not None and isinstance(uid, str) and uid != owner):
            gone = raw_job is not None
            lookups.labels("owner_gone" if gone else "not_found").inc()
            why = (f"{noun} {namespace}/{job_name} is not the Pod's owner (uid {owner}): it was deleted" if gone
                   else f"{noun} {namespace}/{job_name} not found")
            log.warning("%s; Pod passes unchanged", why, extra=context)
            return AdmissionResponse.allow("no-job", [f"volcano-job-webhook: {why}: Pod not wired by its plugins"])
        lookups.labels("found").inc()

        try:
            result = self.jobs.prepared(raw_job).mutate(dict(pod), volcano_wired=True)
        except PluginError as exc:
            if self.audit:
                log.warning("Pod would be denied (audit): %s", exc, extra={**context, "result": "audit"})
                return AdmissionResponse.allow("audit", [f"volcano-job-webhook (audit): would deny: {exc}"])
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


# What of a Job the plugins read: an UPDATE that changes none of it is not judged again. Of an
# Indexed Job or a JobSet, the whole spec (the pod templates are most of it).
def _plugin_inputs(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    meta = metadata(obj)
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    read = (spec.get("plugins"), spec.get("tasks")) if kind_of(obj) is VOLCANO_JOB else (spec,)
    return (meta.get("name"), *read, annotations.get(PLUGINS_ANNOTATION), annotations.get(ENV_PLACEMENT_ANNOTATION))


def _typed(obj: Mapping[str, Any], req: AdmissionRequest) -> Mapping[str, Any]:
    """``obj`` with the request's apiVersion and kind when it has none (read_workload tells the
    kinds apart by them)."""
    if obj.get("apiVersion") and obj.get("kind"):
        return obj
    group = f"{req.kind.group}/" if req.kind.group else ""
    return {**obj, "apiVersion": f"{group}{req.kind.version}", "kind": req.kind.kind}


class JobValidator:
    """Denies a workload whose plugins would fail, with the message its Pods would get (an Indexed
    Job or JobSet only when it names plugins, and also when it does not opt in). An UPDATE is judged
    only when it changes what the plugins read, and refused only for a problem the old object did
    not have, so a running job is never locked against ``kubectl label``; ``audit`` warns instead."""

    def __init__(self, chain: Chain, *, audit: bool = False) -> None:
        self.chain = chain
        self.audit = audit

    async def __call__(self, req: AdmissionRequest) -> AdmissionResponse:
        kind = by_group_kind(req.kind.group, req.kind.kind)
        if kind not in WORKLOADS or req.operation not in ("CREATE", "UPDATE"):
            return AdmissionResponse.allow("ignored")
        if not isinstance(req.object, Mapping):
            return AdmissionResponse.deny("request.object: missing or not a Volcano Job", code=400, result="bad-request")
        obj = _typed(req.object, req)
        if kind is not VOLCANO_JOB:
            annotations = metadata(obj).get("annotations")
            if (not isinstance(annotations, Mapping) or PLUGINS_ANNOTATION not in annotations
                    or jobset_child(obj)):  # a JobSet's Job: judged as the JobSet
                return AdmissionResponse.allow("ignored")
        if nested_deeper_than(obj) or nested_deeper_than(req.old_object):
            return _too_deep()
        if metadata(obj).get("deletionTimestamp"):
            return AdmissionResponse.allow("ignored")
        old = _typed(req.old_object, req) if req.operation == "UPDATE" and isinstance(req.old_object, Mapping) else None
        if old is not None and _plugin_inputs(old) == _plugin_inputs(obj):
            return AdmissionResponse.allow("unchanged")
        try:
            warnings = self._check(obj, req.namespace)
        except PluginError as exc:
            if old is not None and self._same_problem(old, req.namespace, exc):
                return AdmissionResponse.allow("allowed", [f"volcano-job-webhook: {exc} (already so before this update)"])
            if self.audit:
                return AdmissionResponse.allow("audit", [f"volcano-job-webhook (audit): would deny: {exc}"])
            return AdmissionResponse.deny(str(exc))
        return AdmissionResponse.allow("allowed", warnings)

    def _check(self, job: Mapping[str, Any], namespace: str) -> list[str]:
        obj = dict(job)
        meta = metadata(obj)
        if namespace and not meta.get("namespace"):
            # A namespaced CREATE may leave the namespace to the request.
            obj["metadata"] = {**meta, "namespace": namespace}
        workload = read_workload(obj)
        require_opt_in(workload)
        return self.chain.check(workload)

    def _same_problem(self, old: Mapping[str, Any], namespace: str, problem: PluginError) -> bool:
        try:
            self._check(old, namespace)
        except PluginError as before:
            return str(before) == str(problem)
        return False
