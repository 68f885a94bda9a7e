"""The kinds the reconciler owns (the side objects', by name) and those it reads and writes for itself, and how
it recognises its own objects: our label, our field manager, and the workload their controller reference names."""

from __future__ import annotations

from typing import Any

from volcano_job_webhook.kube.records import shared_uid
from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL
from volcano_job_webhook.plugins.kinds import SIDE_OBJECT_KINDS, WORKLOADS, Kind, ObjectKey, controller_of

# The field manager of every write (creates, applies, merge patches): what it set is ours to remove.
FIELD_MANAGER = MANAGED_BY
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

# The owned kinds by name (how the writer and its caches name them).
OWNED: dict[str, Kind] = {kind.kind: kind for kind in SIDE_OBJECT_KINDS}
# Its own: the warnings on a workload, the leader's Lease, and what the registration watches (the
# install's ClusterRole, which owns the webhook configurations, and the webhook Service's endpoints).
EVENT = Kind("", "v1", "Event", "events", "Event")
LEASE = Kind("coordination.k8s.io", "v1", "Lease", "leases", "Lease")
CLUSTER_ROLE = Kind("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", "ClusterRole")
ENDPOINT_SLICE = Kind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", "EndpointSlice")


def managed(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def controlling(obj: dict[str, Any]) -> tuple[Kind | None, ObjectKey | None, str | None]:
    """The workload kind, key and uid of ``obj``'s controller reference (Nones when it has none to a
    workload), the strings interned: every record of a job's objects shares them."""
    ref = controller_of(obj)
    if ref is None or ref.kind not in WORKLOADS:
        return None, None, None
    return ref.kind, ObjectKey.of((obj.get("metadata") or {}).get("namespace"), ref.name), shared_uid(ref.uid)
