"""Indexed Jobs and JobSets as the reconciler caches them (docs/workloads.md#side-objects).

A cluster's batch Jobs are mostly not ours: a record keeps the identity of every one (its objects,
if it has any of ours, are deleted when it stops asking) and the object itself only for a workload
that opted in — our annotation, or the opt-in label on a Pod template — and has not finished.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import orjson

from volcano_job_webhook.kube.records import Packer, intern_key, resource_version, shared_uid
from volcano_job_webhook.plugins.workloads import finished_phase, opted_in

Obj = dict[str, Any]

# What the packing dictionary starts from: the words every batch Job and JobSet repeats.
WORKLOADS = Packer(orjson.dumps({
    "apiVersion": "batch/v1", "kind": "Job", "metadata": {"labels": {}, "annotations": {"volcano-job-webhook/plugins": ""}},
    "spec": {"completionMode": "Indexed", "completions": 1, "parallelism": 1, "backoffLimit": 6, "suspend": False,
             "podReplacementPolicy": "TerminatingOrFailed", "manualSelector": False,
             "template": {"metadata": {"labels": {"volcano-job-webhook/enabled": "true"}},
                          "spec": {"containers": [{"name": "", "image": "", "command": [], "env": [], "resources": {}}],
                                   "restartPolicy": "Never", "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler",
                                   "terminationGracePeriodSeconds": 30, "securityContext": {}}}},
    "replicatedJobs": [{"name": "", "replicas": 1, "template": {}}], "network": {"enableDNSHostnames": True},
}))


class WorkloadRecord:
    """A cached Indexed Job or JobSet: identity, and the object packed while it is ours and running."""

    __slots__ = ("_blob", "api_version", "deleting", "key", "kind", "phase", "reconciled", "uid", "version")

    def __init__(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.key = intern_key(obj)
        self.version = resource_version(obj)
        self.uid = shared_uid(meta.get("uid"))
        self.api_version = sys.intern(str(obj.get("apiVersion") or ""))
        self.kind = sys.intern(str(obj.get("kind") or ""))
        self.deleting = bool(meta.get("deletionTimestamp"))
        self.phase = finished_phase(obj)
        self.reconciled: int | None = None
        # Not ours, or finished: it wants no objects, and nothing of it but its identity is needed.
        ours = opted_in(obj) and not self.phase
        self._blob = WORKLOADS.pack(_body(obj)) if ours else None

    @property
    def finished(self) -> bool:
        """Wants no side objects: finished, or never opted in."""
        return self._blob is None

    def object(self) -> Obj:
        if self._blob is not None:
            found: Obj = WORKLOADS.unpack(self._blob)
            return found
        meta: Obj = {"name": self.key[1], "namespace": self.key[0], "uid": self.uid, "resourceVersion": str(self.version)}
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": meta}

    def __repr__(self) -> str:
        return f"WorkloadRecord({self.kind} {self.key[0]}/{self.key[1]}, uid={self.uid}, version={self.version})"


def _body(obj: Mapping[str, Any]) -> Obj:
    """The workload without its status and managedFields (neither is read by a plugin)."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": meta, "spec": obj.get("spec")}
