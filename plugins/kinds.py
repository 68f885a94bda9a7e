"""The table of the kinds plugins read, make and wire, with its lookups (apimachinery's RESTMapper in
our terms); a process's own kinds (its Lease, its Events) are defined where it uses them."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from .keys import BATCH_JOB_NAME_KEY, JOB_NAME_KEY, JOBSET_NAME_KEY, JOBSET_UID_KEY

__all__ = [
    "BATCH_JOB",
    "CONFIG_MAP",
    "JOBSET",
    "KINDS",
    "NETWORK_POLICY",
    "POD",
    "SECRET",
    "SERVICE",
    "SIDE_OBJECT_KINDS",
    "VOLCANO_JOB",
    "WORKLOADS",
    "Kind",
    "ObjectKey",
    "OwnerRef",
    "by_group_kind",
    "by_resource",
    "controller_of",
    "kind_of",
]


@dataclass(frozen=True, eq=False)
class Kind:
    """One row of the table. Compared by identity: each kind is one object, a cheap dict key."""

    group: str
    version: str
    kind: str
    plural: str
    # What a message calls one ("job {namespace}/{name} not found").
    noun: str
    # A workload's Pods: the label naming it on each (also what selects them) ...
    pod_label: str = ""
    # ... the label holding its uid, where its Pods are not its own (a JobSet's belong to its Jobs);
    # otherwise the uid is their controller reference's ...
    pod_uid_label: str = ""
    # ... and whether a Pod is wired only when it carries the opt-in label (docs/workloads.md).
    opt_in: bool = False
    # What a list of workloads of several kinds calls it ("Volcano Job default/a"): every workload has one.
    title: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """``plural.group`` (``jobs.batch``; the plural alone for the core group)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path: ``/api/v1/...`` for the core group, else ``/apis/<group>/<version>/...``."""
        base = f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"
        if namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        return f"{base}/{name}" if name else base

    def __repr__(self) -> str:
        return f"Kind({self.resource})"


# The workloads, in the order a Pod is matched to one: a JobSet's Pods carry its Jobs' labels too.
VOLCANO_JOB = Kind("batch.volcano.sh", "v1alpha1", "Job", "jobs", "job", pod_label=JOB_NAME_KEY,
                   title="Volcano Job")
JOBSET = Kind("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets", "JobSet", pod_label=JOBSET_NAME_KEY,
              pod_uid_label=JOBSET_UID_KEY, opt_in=True, title="JobSet")
BATCH_JOB = Kind("batch", "v1", "Job", "jobs", "Job", pod_label=BATCH_JOB_NAME_KEY, opt_in=True,
                 title="Indexed Job")
# The side objects: what the plugins make for a workload, which the reconciler keeps.
CONFIG_MAP = Kind("", "v1", "ConfigMap", "configmaps", "ConfigMap")
SECRET = Kind("", "v1", "Secret", "secrets", "Secret")
SERVICE = Kind("", "v1", "Service", "services", "Service")
NETWORK_POLICY = Kind("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", "NetworkPolicy")
# What the plugins wire.
POD = Kind("", "v1", "Pod", "pods", "Pod")

KINDS = (VOLCANO_JOB, JOBSET, BATCH_JOB, CONFIG_MAP, SECRET, SERVICE, NETWORK_POLICY, POD)
SIDE_OBJECT_KINDS = (CONFIG_MAP, SECRET, SERVICE, NETWORK_POLICY)
WORKLOADS = tuple(kind for kind in KINDS if kind.pod_label)

_BY_RESOURCE = {kind.resource: kind for kind in KINDS}
_BY_GROUP_KIND: dict[tuple[str, Any], Kind] = {(kind.group, kind.kind): kind for kind in KINDS}


def by_resource(resource: str) -> Kind:
    """The kind named ``plural.group`` (``jobs.batch``, ``jobsets.jobset.x-k8s.io``); KeyError otherwise."""
    return _BY_RESOURCE[resource]


def by_group_kind(group: str, kind: Any) -> Kind | None:
    """The kind of an owner reference's or an admission request's (group, kind), any version."""
    return _BY_GROUP_KIND.get((group, kind))


def kind_of(obj: Mapping[str, Any]) -> Kind | None:
    """The kind of an object, by its ``apiVersion`` and ``kind``; a ``kind: Job`` without
    ``apiVersion`` is Volcano's (a job file may leave it out)."""
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not api_version:
        return VOLCANO_JOB if kind == VOLCANO_JOB.kind else None
    return _BY_GROUP_KIND.get((str(api_version).rpartition("/")[0], kind))


class ObjectKey(NamedTuple):
    """An object's namespace and name: its key in a cache and in a work queue, and what a reconcile
    is asked for (controller-runtime's ``types.NamespacedName``, ``reconcile.Request``). Which kind
    it names is its cache's or controller's to say."""

    namespace: str
    name: str

    @classmethod
    def of(cls, namespace: Any, name: Any) -> ObjectKey:
        """The key with both strings interned: one copy of each name however many caches,
        indexes and queues hold it (a missing namespace is ``default``)."""
        return cls(sys.intern(str(namespace or "default")), sys.intern(str(name or "")))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class OwnerRef(NamedTuple):
    """An owner reference whose kind is in the table."""

    kind: Kind
    name: str
    uid: str | None


def controller_of(obj: Mapping[str, Any]) -> OwnerRef | None:
    """The owner reference marked ``controller`` of ``obj`` (apimachinery's ``GetControllerOf``),
    when its kind is in the table; None otherwise or for a damaged one."""
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller"):
            kind = by_group_kind(str(ref.get("apiVersion") or "").rpartition("/")[0], ref.get("kind"))
            uid = ref.get("uid")
            return None if kind is None else OwnerRef(kind, str(ref.get("name") or ""), uid if isinstance(uid, str) else None)
    return None
