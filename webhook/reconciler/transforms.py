"""What the reconciler's caches keep of each kind (client-go's ``SetTransform``), to save memory: of its own
objects (:class:`OwnedRecord`) the identity, the workload that controls them, the paths our field manager
set and the rest packed, long data values as digests; of Indexed Jobs and JobSets (:class:`WorkloadRecord`)
the identity, and the object only while it opted in and runs. Volcano Jobs are kube/records.py's."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from volcano_job_webhook.kube.records import JobRecord, Packer, intern_key, resource_version, shared_uid
from volcano_job_webhook.plugins.kinds import BATCH_JOB, JOBSET, SIDE_OBJECT_KINDS, VOLCANO_JOB, Kind
from volcano_job_webhook.plugins.workloads import finished_phase, opted_in

from .compare import OUR_FIELDS, our_fields
from .digests import digested, undigested
from .owned import FIELD_MANAGER, controlling


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
    """A cached object of ours: identity, the workload that controls it, the paths our field manager set, and the rest
    packed — long data values (host files, SSH keys) as digests, never the values."""

    __slots__ = ("_blob", "_packed_uid", "key", "our_fields", "version", "workload", "workload_kind", "workload_uid")

    def __init__(self, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.key = intern_key(obj)
        self.version = resource_version(obj)
        self._packed_uid = packed_uid(meta.get("uid"))
        # The workload that controls it — whose reconcile an event on it queues — and which one of
        # all that ever had that name: a job deleted and made again is another job, whose objects
        # these are not.
        self.workload_kind, self.workload, self.workload_uid = controlling(obj)
        self.our_fields = our_fields(meta.get("managedFields") or [], FIELD_MANAGER)
        body = {k: obj[k] for k in ("apiVersion", "kind", *_CONTENT) if k in obj}
        body["metadata"] = {k: meta[k] for k in _METADATA if k in meta}
        self._blob = OBJECTS.pack(digested(body))

    @property
    def uid(self) -> str | None:
        return unpacked_uid(self._packed_uid)

    def object(self) -> dict[str, Any]:
        """The object as the comparison reads it (:data:`OUR_FIELDS` set, long values digests)."""
        obj: dict[str, Any] = undigested(OBJECTS.unpack(self._blob))
        obj[OUR_FIELDS] = self.our_fields
        return obj

    def __repr__(self) -> str:
        return (f"OwnedRecord({self.key[0]}/{self.key[1]}, version={self.version}, workload={self.workload_kind} {self.workload}, "
                f"workload_uid={self.workload_uid})")


class WorkloadRecord(JobRecord):
    """A cached Indexed Job or JobSet: identity, and the object (no status, no managedFields) packed
    only while it opted in and runs (docs/workloads.md#side-objects) — most of a cluster's batch Jobs
    are not ours. Its phase is "Completed" or "Failed" once it starts no Pod again, else ""."""

    __slots__ = ("api_version", "kind", "opted_in")
    _packer = WORKLOAD_OBJECTS

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
        self.opted_in = opted_in(obj)
        self._blob = WORKLOAD_OBJECTS.pack(body) if self.opted_in and not self.phase else None


# The one place kinds meet records: what a cache of each kind keeps.
TRANSFORMS: dict[Kind, Callable[[dict[str, Any]], Any]] = {
    VOLCANO_JOB: JobRecord, BATCH_JOB: WorkloadRecord, JOBSET: WorkloadRecord, **dict.fromkeys(SIDE_OBJECT_KINDS, OwnedRecord)}
