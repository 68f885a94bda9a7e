"""What the caches keep of an object (client-go's ``SetTransform``), to save memory: a few Python objects,
the rest packed as compressed JSON; of a Job only what plugins may read
(docs/plugins.md#the-job-a-plugin-is-given), of a finished one only its identity and phase.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

import orjson
import zstandard

from volcano_job_webhook.plugins.keys import FINISHED_PHASES
from volcano_job_webhook.plugins.kinds import VOLCANO_JOB, ObjectKey

Obj = dict[str, Any]

JOB_METADATA = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", "deletionTimestamp")
JOB_TASK = ("name", "replicas", "template")
JOB_STATUS = ("version", "retryCount", "controlledResources")


def shared_uid(uid: Any) -> str | None:
    """A uid string interned: a Job's record and its objects' owner references hold it once."""
    return sys.intern(uid) if isinstance(uid, str) else None


# A resourceVersion as a cache keeps it (opaque, compared for equality only): an int when decimal, as smaller.
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
    """Objects as zstd-compressed JSON, on a dictionary per kind learned from its first ``learn`` objects
    (the images, commands and variable names most share). A blob's first byte names its dictionary
    (0: none yet); the zstd objects, not thread-safe, are per thread."""

    def __init__(self, learn: int = 8, limit: int = 96 * 1024) -> None:
        self._dictionaries: list[zstandard.ZstdCompressionDict | None] = [None]
        self._by_kind: dict[Any, int] = {}
        self._samples: dict[Any, list[bytes]] = {}
        self._learn = learn
        self._limit = limit
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
        kind = obj.get("kind") if isinstance(obj, Mapping) else None
        generation = self._by_kind.get(kind, 0)
        if generation == 0:
            self._sample(kind, data)
        return bytes((generation,)) + self._tools(generation)[0].compress(data)

    def unpack(self, blob: bytes) -> Any:
        # No content size in the frame (it would cost bytes per object): read as a stream.
        return orjson.loads(self._tools(blob[0])[1].decompressobj().decompress(blob[1:]))

    def _sample(self, kind: Any, data: bytes) -> None:
        with self._lock:
            if kind in self._by_kind or len(self._dictionaries) > 255:
                return
            samples = self._samples.setdefault(kind, [])
            samples.append(data)
            if len(samples) == self._learn:
                learned = b"".join(samples)[-self._limit:]
                self._dictionaries.append(zstandard.ZstdCompressionDict(learned, dict_type=zstandard.DICT_TYPE_RAWCONTENT))
                self._by_kind[kind] = len(self._dictionaries) - 1
                del self._samples[kind]


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


JOBS = Packer()


class JobRecord:
    """A cached Volcano Job: identity, phase, and (unless finished) the fields plugins read, packed."""

    __slots__ = ("_blob", "deleting", "key", "phase", "uid", "version")
    api_version = VOLCANO_JOB.api_version
    kind = VOLCANO_JOB.kind
    opted_in = True  # as every workload record says whether it asked for plugins: a Volcano Job always has
    _packer = JOBS

    def __init__(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        state = (obj.get("status") or {}).get("state") if isinstance(obj.get("status"), Mapping) else None
        phase = state.get("phase") if isinstance(state, Mapping) else None
        self.key = intern_key(obj)
        self.version = resource_version(obj)
        self.uid = shared_uid(meta.get("uid"))
        self.phase = sys.intern(phase) if isinstance(phase, str) else ""
        self.deleting = bool(meta.get("deletionTimestamp"))
        # A finished Job starts no Pod again: nothing of it but its identity is needed.
        self._blob = None if self.finished else JOBS.pack(_job_body(obj))

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    def object(self) -> Obj:
        """The Job as plugins read it (identity and status only, for a finished Job)."""
        if self._blob is not None:
            return self._packer.unpack(self._blob)
        meta: Obj = {"name": self.key[1], "namespace": self.key[0], "uid": self.uid, "resourceVersion": str(self.version)}
        return {"apiVersion": self.api_version, "kind": self.kind, "metadata": meta,
                "status": {"state": {"phase": self.phase}}}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.kind} {self.key}, uid={self.uid}, version={self.version}, phase={self.phase!r})"


class ObjectRecord:
    """An object kept as it is (but its managedFields): for the few objects of a kind a cache holds."""

    __slots__ = ("key", "object", "version")

    def __init__(self, obj: Obj) -> None:
        (obj.get("metadata") or {}).pop("managedFields", None)
        self.key, self.version, self.object = intern_key(obj), resource_version(obj), obj
