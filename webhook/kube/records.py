"""What the caches keep of an object: a record of a few Python objects, the rest packed in bytes and
decoded on demand — client-go's ``SetTransform`` and controller-runtime's ``DefaultTransform`` in our
terms.

A cluster holds tens of thousands of Volcano Jobs, most finished. As a Python dict a 3 KB Job is
tens of thousands of bytes and hundreds of objects the garbage collector walks; as a record it is
one object, its identity, and the fields the plugins read packed as compressed JSON — about a
kilobyte. A finished Job keeps its identity and phase only: no Pod of it is created again.

What a record of a Job keeps (the promise to plugins, docs/plugins.md#the-job-a-plugin-is-given):
``metadata`` (name, namespace, uid, resourceVersion, labels, annotations, deletionTimestamp),
``spec.plugins``, ``spec.tasks[]`` (name, replicas, template), and ``status`` (state.phase,
controlledResources, version, retryCount). Nothing else of a cached Job reaches a plugin.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import orjson
import zstandard

from volcano_job_webhook.plugins.base import Digest
from volcano_job_webhook.plugins.keys import FINISHED_PHASES
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, ObjectKey

Obj = dict[str, Any]

# Values of a ConfigMap's or Secret's data longer than this are kept as a digest (host files, keys).
DIGEST_OVER = 64
_DIGEST_PREFIX = "\x00digest:"
_DATA_MAPS = ("data", "binaryData", "stringData")

JOB_METADATA = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", "deletionTimestamp")
JOB_TASK = ("name", "replicas", "template")
JOB_STATUS = ("version", "retryCount", "controlledResources")


def shared_uid(uid: Any) -> str | None:
    """A uid string shared by everything that names it (a Job's record and its objects' owner
    references): interned, so 100,000 Jobs hold each uid once, not four times."""
    return sys.intern(uid) if isinstance(uid, str) else None


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


# An object's resourceVersion as a cache keeps it: opaque, compared for equality only (the API's
# contract), held as an int when it is the decimal number every kube-apiserver gives (28 bytes, not
# a string's 57, in each of half a million records), else as the string it is.
Version = int | str


def resource_version(obj: Mapping[str, Any]) -> Version:
    """``metadata.resourceVersion`` as a :data:`Version` (``""`` when absent); ``str()`` gives it back."""
    text = (obj.get("metadata") or {}).get("resourceVersion")
    if not isinstance(text, str):
        return ""
    if text.isascii() and text.isdigit() and str(int(text)) == text:
        return int(text)
    return text


def intern_key(obj: Mapping[str, Any]) -> ObjectKey:
    """The object's key, its strings interned (:meth:`ObjectKey.of`)."""
    meta = obj.get("metadata") or {}
    return ObjectKey.of(meta.get("namespace"), meta.get("name"))


class Packer:
    """Objects as compressed JSON, with a dictionary: the vocabulary of their kind to begin with,
    then that and the first ``learn`` objects packed — the cluster's own images, commands and
    variable names, which most of its jobs share. A blob says which dictionary packed it, so both
    stay readable; zstd objects are per thread (they are not thread-safe)."""

    def __init__(self, vocabulary: bytes, learn: int = 8, limit: int = 96 * 1024) -> None:
        self._dictionaries = [zstandard.ZstdCompressionDict(vocabulary, dict_type=zstandard.DICT_TYPE_RAWCONTENT)]
        self._vocabulary = vocabulary
        self._learn = learn
        self._limit = limit
        self._samples: list[bytes] = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def _tools(self, generation: int) -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
        tools: dict[int, tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]] | None = getattr(self._local, "tools", None)
        if tools is None:
            tools = self._local.tools = {}
        found = tools.get(generation)
        if found is None:
            dictionary = self._dictionaries[generation]
            found = tools[generation] = (
                zstandard.ZstdCompressor(level=3, dict_data=dictionary, write_content_size=False, write_checksum=False,
                                         write_dict_id=False),
                zstandard.ZstdDecompressor(dict_data=dictionary),
            )
        return found

    def pack(self, obj: Any) -> bytes:
        data = orjson.dumps(obj)
        generation = len(self._dictionaries) - 1
        if generation == 0 and len(self._samples) < self._learn:
            self._sample(data)
        return bytes((generation,)) + self._tools(generation)[0].compress(data)

    def unpack(self, blob: bytes) -> Any:
        # No content size in the frame (it would cost bytes per object): read as a stream.
        return orjson.loads(self._tools(blob[0])[1].decompressobj().decompress(blob[1:]))

    def _sample(self, data: bytes) -> None:
        with self._lock:
            if len(self._dictionaries) > 1 or len(self._samples) >= self._learn:
                return
            self._samples.append(data)
            if len(self._samples) == self._learn:
                # zstd matches nearest the end best: the samples after the vocabulary.
                learned = (self._vocabulary + b"".join(self._samples))[-self._limit:]
                self._dictionaries.append(zstandard.ZstdCompressionDict(learned, dict_type=zstandard.DICT_TYPE_RAWCONTENT))


def digest(value: str) -> Digest:
    return Digest(_DIGEST_PREFIX + hashlib.blake2b(value.encode(), digest_size=16).hexdigest())


def digested(obj: Obj) -> Obj:
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


def undigested(obj: Obj) -> Obj:
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


def _pick(source: Any, keys: tuple[str, ...]) -> Obj:
    return {k: source[k] for k in keys if k in source} if isinstance(source, Mapping) else {}


def _job_body(obj: Mapping[str, Any]) -> Obj:
    """The Job as a plugin may read it (see the module docstring)."""
    spec: Mapping[str, Any] = obj["spec"] if isinstance(obj.get("spec"), Mapping) else {}
    status: Mapping[str, Any] = obj["status"] if isinstance(obj.get("status"), Mapping) else {}
    tasks = spec.get("tasks")
    body: Obj = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": _pick(obj.get("metadata"), JOB_METADATA),
        "spec": {
            **({"plugins": spec["plugins"]} if "plugins" in spec else {}),
            "tasks": [_pick(t, JOB_TASK) if isinstance(t, Mapping) else t for t in tasks] if isinstance(tasks, list) else tasks,
        },
    }
    state = status.get("state")
    kept = _pick(status, JOB_STATUS)
    if isinstance(state, Mapping) and "phase" in state:
        kept["state"] = {"phase": state["phase"]}
    if kept:
        body["status"] = kept
    return body


def _job_vocabulary() -> bytes:
    """What Volcano Jobs have in common, as JSON: the dictionary's start."""
    container = {"name": "main", "image": "", "imagePullPolicy": "IfNotPresent", "command": ["python", "-m"], "args": [],
                 "env": [{"name": "", "value": ""}, {"name": "", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                 "resources": {"limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}, "requests": {"cpu": "1", "memory": "1Gi"}},
                 "volumeMounts": [{"name": "", "mountPath": "/"}], "ports": [{"name": "", "containerPort": 8080, "protocol": "TCP"}]}
    template = {"metadata": {"labels": {}, "annotations": {}}, "spec": {
        "containers": [container], "initContainers": [container], "restartPolicy": "OnFailure", "schedulerName": "volcano",
        "volumes": [{"name": "", "persistentVolumeClaim": {"claimName": ""}}, {"name": "", "configMap": {"name": ""}},
                    {"name": "", "emptyDir": {}}], "nodeSelector": {}, "tolerations": [], "imagePullSecrets": []}}
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
           "metadata": {"name": "", "namespace": "default", "uid": "", "resourceVersion": "", "labels": {},
                        "annotations": {"volcano-job-webhook/plugins": '{"env": [], "svc": [], "pytorch": ["--master=master"]}'}},
           "spec": {"plugins": {"env": [], "svc": [], "ssh": [], "pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
                    "tasks": [{"name": "master", "replicas": 1, "template": template}, {"name": "worker", "replicas": 2, "template": template}]},
           "status": {"state": {"phase": "Running"}, "controlledResources": {"plugin-svc": "svc"}, "version": 0, "retryCount": 0}}
    return orjson.dumps(job)


JOBS = Packer(_job_vocabulary())


class JobRecord:
    """A cached Volcano Job: identity, phase, and (unless finished) the fields plugins read, packed."""

    __slots__ = ("_blob", "deleting", "key", "phase", "reconciled", "uid", "version")
    api_version = VOLCANO_JOB.api_version
    kind = VOLCANO_JOB.kind

    def __init__(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        state = (obj.get("status") or {}).get("state") if isinstance(obj.get("status"), Mapping) else None
        phase = state.get("phase") if isinstance(state, Mapping) else None
        self.key = intern_key(obj)
        self.version = resource_version(obj)
        self.uid = shared_uid(meta.get("uid"))
        self.phase = sys.intern(phase) if isinstance(phase, str) else ""
        self.deleting = bool(meta.get("deletionTimestamp"))
        # The reconciler's memo: the fingerprint of the job's objects when it last found them in
        # order at this version of the Job (a new version is a new record, so it starts over).
        self.reconciled: int | None = None
        # A finished Job starts no Pod again: nothing of it but its identity is needed.
        self._blob = None if self.finished else JOBS.pack(_job_body(obj))

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @property
    def packed_size(self) -> int:
        """Bytes the packed fields take (0 for a finished Job)."""
        return 0 if self._blob is None else len(self._blob)

    def object(self) -> Obj:
        """The Job as plugins read it (identity and status only, for a finished Job)."""
        if self._blob is not None:
            return JOBS.unpack(self._blob)
        meta: Obj = {"name": self.key[1], "namespace": self.key[0], "uid": self.uid, "resourceVersion": str(self.version)}
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": meta,
                "status": {"state": {"phase": self.phase}}}

    def __repr__(self) -> str:
        return f"JobRecord({self.key[0]}/{self.key[1]}, uid={self.uid}, version={self.version}, phase={self.phase!r})"


def job_record(obj: Obj) -> JobRecord:
    return JobRecord(obj)
