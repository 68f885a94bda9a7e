"""The kinds the reconciler owns (the table's, by name), how it recognises its own objects, and what
of them it caches (:class:`OwnedRecord`)."""

from __future__ import annotations

from typing import Any

import orjson

from volcano_job_webhook.kube.records import (
    Packer,
    digested,
    intern_key,
    packed_uid,
    resource_version,
    shared_uid,
    undigested,
    unpacked_uid,
)
from volcano_job_webhook.plugins import kinds as table
from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL
from volcano_job_webhook.plugins.kinds import WORKLOADS, Kind, ObjectKey, controller_of

from .compare import OWNED_FIELDS, owned_paths

# The field manager of every write (creates, applies, merge patches): what it set is ours to remove.
FIELD_MANAGER = MANAGED_BY
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"


# The owned kinds by name (how the writer and its caches name them).
OWNED: dict[str, Kind] = {kind.kind: kind for kind in table.OWNED}


def managed(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


# What of an owned object the comparison reads: its identity, labels, annotations and owner
# references, and its content. Not its status, timestamps or managedFields (of which only the
# paths our manager owns are kept, see compare.owned_paths).
_METADATA = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", "ownerReferences")
_CONTENT = ("data", "binaryData", "type", "spec", "immutable")


def _vocabulary() -> bytes:
    """What our objects have in common, as JSON (as the plugins make them, as the API server keeps
    them): the packing dictionary's start."""
    meta = {"name": "", "namespace": "default", "uid": "", "resourceVersion": "", "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "", "uid": "",
                                 "controller": True, "blockOwnerDeletion": True}]}
    selector = {"volcano.sh/job-name": "", "volcano.sh/job-namespace": "default", "volcano.sh/task-spec": ""}
    objects = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
         "data": {"VC_MASTER_HOSTS": "", "VC_MASTER_NUM": "1", "VC_WORKER_HOSTS": "", "VC_WORKER_NUM": "2",
                  "master.host": "", "worker.host": "", "hostfile": " slots=1\n"}},
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta,
         "data": {"id_rsa": "", "id_rsa.pub": "", "authorized_keys": "", "config": ""}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"clusterIP": "None", "clusterIPs": ["None"], "selector": selector, "publishNotReadyAddresses": True,
                  "ports": [{"name": "placeholder-volcano", "port": 1, "protocol": "TCP", "targetPort": 1}],
                  "type": "ClusterIP", "sessionAffinity": "None", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                  "internalTrafficPolicy": "Cluster"}},
        {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
         "spec": {"podSelector": {"matchLabels": selector}, "ingress": [{"from": [{"podSelector": {"matchLabels": selector}}]}],
                  "policyTypes": ["Ingress"]}},
    ]
    return b"".join(orjson.dumps(obj) for obj in objects)


OBJECTS = Packer(_vocabulary())


class OwnedRecord:
    """A cached object of ours: identity, owner, the paths our field manager owns, and the rest
    packed — long data values (host files, SSH keys) as digests, never the values."""

    __slots__ = ("_blob", "_packed_uid", "key", "owned", "owner", "owner_kind", "owner_uid", "version")

    def __init__(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.key = intern_key(obj)
        self.version = resource_version(obj)
        self._packed_uid = packed_uid(meta.get("uid"))
        # The workload that controls it — whose reconcile an event on it queues — and which one of
        # all that ever had that name: a job deleted and made again is another job, whose objects
        # these are not.
        self.owner_kind, self.owner, self.owner_uid = controlling(obj)
        self.owned = owned_paths(meta.get("managedFields") or [], FIELD_MANAGER)
        body = {k: obj[k] for k in ("apiVersion", "kind", *_CONTENT) if k in obj}
        body["metadata"] = {k: meta[k] for k in _METADATA if k in meta}
        self._blob = OBJECTS.pack(digested(body))

    @property
    def uid(self) -> str | None:
        return unpacked_uid(self._packed_uid)

    def object(self) -> dict[str, Any]:
        """The object as the comparison reads it (:data:`OWNED_FIELDS` set, long values digests)."""
        obj: dict[str, Any] = undigested(OBJECTS.unpack(self._blob))
        obj[OWNED_FIELDS] = self.owned
        return obj

    def __repr__(self) -> str:
        return (f"OwnedRecord({self.key[0]}/{self.key[1]}, version={self.version}, owner={self.owner_kind} {self.owner}, "
                f"owner_uid={self.owner_uid})")


def controlling(obj: dict[str, Any]) -> tuple[Kind | None, ObjectKey | None, str | None]:
    """The workload kind, key and uid of ``obj``'s controller reference (Nones when it has none to a
    workload), the strings interned: every record of a job's objects shares them."""
    ref = controller_of(obj)
    if ref is None or ref.kind not in WORKLOADS:
        return None, None, None
    return ref.kind, ObjectKey.of((obj.get("metadata") or {}).get("namespace"), ref.name), shared_uid(ref.uid)
