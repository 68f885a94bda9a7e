"""The kinds the reconciler owns (the table's, by name) and those it reads and writes for itself, how it
recognises its own objects, and what its caches keep of them (:class:`OwnedRecord`, long data values as
digests) and of Indexed Jobs and JobSets (:class:`WorkloadRecord`)."""

from __future__ import annotations

import hashlib
import sys
import uuid
from collections.abc import Mapping
from typing import Any

from volcano_job_webhook.kube.records import Packer, intern_key, resource_version, shared_uid
from volcano_job_webhook.plugins.base import Digest
from volcano_job_webhook.plugins.keys import MANAGED_BY, MANAGED_BY_LABEL
from volcano_job_webhook.plugins.kinds import KINDS, WORKLOADS, Cached, Kind, ObjectKey, controller_of
from volcano_job_webhook.plugins.workloads import finished_phase, opted_in

from .compare import OWNED_FIELDS, owned_paths

# The field manager of every write (creates, applies, merge patches): what it set is ours to remove.
FIELD_MANAGER = MANAGED_BY
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

# The owned kinds by name (how the writer and its caches name them).
OWNED: dict[str, Kind] = {kind.kind: kind for kind in KINDS if kind.cached is Cached.OWNED}
# Its own: the warnings on a workload, the leader's Lease, and what the registration watches (the
# install's ClusterRole, which owns the webhook configurations, and the webhook Service's endpoints).
EVENT = Kind("", "v1", "Event", "events", "Event")
LEASE = Kind("coordination.k8s.io", "v1", "Lease", "leases", "Lease")
CLUSTER_ROLE = Kind("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", "ClusterRole")
ENDPOINT_SLICE = Kind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", "EndpointSlice")


def managed(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


# Values of a ConfigMap's or Secret's data longer than this are kept as a digest (host files, keys).
DIGEST_OVER = 64
_DIGEST_PREFIX = "\x00digest:"
_DATA_MAPS = ("data", "binaryData", "stringData")


def digest(value: str) -> Digest:
    return Digest(_DIGEST_PREFIX + hashlib.blake2b(value.encode(), digest_size=16).hexdigest())


def digested(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with every long value of its data maps replaced by its :class:`Digest` (a shallow
    copy where anything changes): what the reconciler compares, and what it keeps."""
    out = obj
    for field in _DATA_MAPS:
        data = obj.get(field)
        if not isinstance(data, Mapping):
            continue
        if any(isinstance(v, str) and len(v) > DIGEST_OVER and not isinstance(v, Digest) for v in data.values()):
            if out is obj:
                out = dict(obj)
            out[field] = {k: digest(v) if isinstance(v, str) and len(v) > DIGEST_OVER and not isinstance(v, Digest) else v
                          for k, v in data.items()}
    return out


def undigested(obj: dict[str, Any]) -> dict[str, Any]:
    """Digests read back from packed JSON (where they are plain strings) as :class:`Digest`."""
    for field in _DATA_MAPS:
        data = obj.get(field)
        if isinstance(data, dict):
            for key, value in data.items():
                if isinstance(value, str) and value.startswith(_DIGEST_PREFIX):
                    data[key] = Digest(value)
    return obj


def has_digests(obj: Mapping[str, Any]) -> bool:
    return any(isinstance(v, Digest) for field in _DATA_MAPS for v in (obj.get(field) or {}).values())


def packed_uid(uid: Any) -> bytes | str | None:
    """An object's own uid in 16 bytes when it is a canonical UUID (every uid the API server makes),
    as given otherwise; :func:`unpacked_uid` gives it back."""
    if not isinstance(uid, str):
        return None
    try:
        packed = uuid.UUID(uid)
    except ValueError:
        return uid
    return packed.bytes if str(packed) == uid else uid


def unpacked_uid(uid: bytes | str | None) -> str | None:
    return str(uuid.UUID(bytes=uid)) if isinstance(uid, bytes) else uid


# What of an owned object the comparison reads: its identity, labels, annotations and owner
# references, and its content. Not its status, timestamps or managedFields (of which only the
# paths our manager owns are kept, see compare.owned_paths).
_METADATA = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", "ownerReferences")
_CONTENT = ("data", "binaryData", "type", "spec", "immutable")
OBJECTS = Packer()
WORKLOAD_OBJECTS = Packer()


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


class WorkloadRecord:
    """A cached Indexed Job or JobSet: identity, and the object (no status, no managedFields) packed
    only while it opted in and runs (docs/workloads.md#side-objects) — most of a cluster's batch Jobs
    are not ours."""

    __slots__ = ("_blob", "api_version", "deleting", "key", "kind", "phase", "uid", "version")

    def __init__(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.key = intern_key(obj)
        self.version = resource_version(obj)
        self.uid = shared_uid(meta.get("uid"))
        self.api_version = sys.intern(str(obj.get("apiVersion") or ""))
        self.kind = sys.intern(str(obj.get("kind") or ""))
        self.deleting = bool(meta.get("deletionTimestamp"))
        self.phase = finished_phase(obj)
        body = {"apiVersion": self.api_version, "kind": self.kind, "spec": obj.get("spec"),
                "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
        self._blob = WORKLOAD_OBJECTS.pack(body) if opted_in(obj) and not self.phase else None

    @property
    def finished(self) -> bool:
        """Wants no side objects: finished, or never opted in."""
        return self._blob is None

    def object(self) -> dict[str, Any]:
        if self._blob is not None:
            found: dict[str, Any] = WORKLOAD_OBJECTS.unpack(self._blob)
            return found
        meta = {"name": self.key[1], "namespace": self.key[0], "uid": self.uid, "resourceVersion": str(self.version)}
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": meta}

    def __repr__(self) -> str:
        return f"WorkloadRecord({self.kind} {self.key[0]}/{self.key[1]}, uid={self.uid}, version={self.version})"
