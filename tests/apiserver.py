"""An in-process test double of the Kubernetes API server, for tests only.

``FakeApiServer`` serves the real Kubernetes REST paths over plain HTTP on
127.0.0.1 (an ephemeral port), so the *official* ``kubernetes`` Python client
(``CoreV1Api``, ``CustomObjectsApi``, ``kubernetes.watch.Watch`` ...) can be
pointed at it unchanged::

    with FakeApiServer() as api:
        core = kubernetes.client.CoreV1Api(api.api_client())
        core.create_namespaced_config_map("default", {"metadata": {"name": "a"}})

What it promises (each one mirrors kube-apiserver):

* Objects are plain dicts.  Every write bumps one global integer
  resourceVersion.  Create fills uid, creationTimestamp, namespace (from the
  URL), ``generateName`` and - for kinds whose real strategy tracks it -
  ``generation``.  A no-op update/patch does not bump the resourceVersion and
  sends no watch event.
* Errors are ``Status`` objects with the real codes, reasons and messages:
  404 NotFound, 409 AlreadyExists / Conflict (stale resourceVersion),
  422 Invalid (names, labels, immutable fields, bad JSON patch),
  415 for a strategic merge patch of a custom resource, 400 BadRequest.
* PATCH understands JSON merge patch, JSON patch, a strategic merge patch that
  knows the merge keys that matter here (containers, env, ports, volumes,
  ownerReferences, webhooks, conditions...) and unions ``finalizers``, and a
  simplified server-side apply (create if missing, else merge).
* ``status`` subresources (pods, services, namespaces, Volcano jobs and
  podgroups): writes to the main resource keep the old status; writes to
  ``/status`` change only the status.
* DELETE honours finalizers (sets deletionTimestamp; the object goes away when
  the last finalizer is removed) and preconditions.  With ``gc=True`` a
  garbage collector runs synchronously after each write: objects whose
  ownerReferences all point at missing uids are deleted, dangling references
  are stripped (``Orphan`` strips references instead of deleting,
  ``Foreground`` deletes dependents before the owner).  With ``gc=False``
  dependents stay, as on a cluster whose garbage collector is off.
* LIST with label selectors (``=``, ``==``, ``!=``, ``in``, ``notin``,
  exists, ``!``) and field selectors, ``limit``/``continue`` paging.  Like the
  real server, items of built-in kinds carry no kind/apiVersion in a list;
  custom resources do.
* WATCH streams newline-delimited JSON over chunked encoding.  No
  resourceVersion (or "0") sends synthetic ADDED events for existing objects
  first; resourceVersion R replays retained events after R.  An R older than
  the retained history answers one ``ERROR`` event (Status 410 Expired, "too
  old resource version") and ends the stream.  Watches end cleanly at
  ``timeoutSeconds``, on ``close_watches()`` and on ``stop()``.  With
  ``allowWatchBookmarks`` BOOKMARK events are sent every
  ``bookmark_interval`` seconds and just before the timeout;
  ``sendInitialEvents=true`` ends the initial ADDED events with a bookmark
  annotated ``k8s.io/initial-events-end``.  A label-selected watch sees an
  object that stops matching as DELETED and one that starts matching as ADDED.

Fault injection (``fail_next``, ``drop_next``, ``close_watches``,
``expire_history``, ``restart``) and introspection (``requests``,
``objects``, ``permissions_used``) are for the tests that drive the product.

Known differences from a real kube-apiserver (deliberate, to stay small):

* No authentication, authorization or admission: webhooks are stored, never
  called.  No managedFields, no selfLink.
* No schema validation or pruning of specs (CRD OpenAPI schemas are not
  known); defaulting only where listed in ``_apply_defaults``.
* Strategic merge patch picks merge keys by field name, not by schema path;
  server-side apply has no field ownership (it merges, it never removes
  fields left out of the applied configuration, and never conflicts).
* The garbage collector is synchronous (real GC is eventually consistent)
  and Foreground deletion adds no ``foregroundDeletion`` finalizer.  Deleting
  a Namespace removes its contents at once, finalizers notwithstanding.
  Pods are deleted at once (no kubelet, no graceful deletion).
* ``events`` (core/v1) and ``events.k8s.io/v1`` are separate stores here; a
  real server serves one resource in two shapes.
* ``limit``/``continue`` pages read the current state, not a snapshot.
"""

from __future__ import annotations

import base64
import bisect
import copy
import http.server
import json
import random
import re
import select
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterable, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

import jsonpatch
import kubernetes.client
import yaml

Obj = dict[str, Any]


# --------------------------------------------------------------------------
# Resource types
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ResourceType:
    """One REST resource: where it lives and which server-side rules apply."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    custom: bool = False  # a CRD: no strategic merge patch, items keep kind in lists
    has_status: bool = False  # has a /status subresource
    tracks_generation: bool = False  # metadata.generation bumped on spec changes
    returns_deleted_object: bool = False  # DELETE answers the object, not a Status
    name_rule: Literal["subdomain", "label", "dns1035"] = "subdomain"
    field_selectors: tuple[str, ...] = ()  # beyond metadata.name / metadata.namespace

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``plural.group`` as in error messages and kubectl (``jobs.batch.volcano.sh``)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


_POD_FIELDS = ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
               "spec.serviceAccountName", "status.phase", "status.podIP",
               "status.nominatedNodeName")
_EVENT_FIELDS = ("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                 "involvedObject.uid", "involvedObject.apiVersion",
                 "involvedObject.resourceVersion", "involvedObject.fieldPath",
                 "reason", "reportingComponent", "source", "type")

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", namespaced=False, has_status=True,
                 name_rule="label", field_selectors=("status.phase",)),
    ResourceType("", "v1", "configmaps", "ConfigMap"),
    ResourceType("", "v1", "secrets", "Secret", field_selectors=("type",)),
    ResourceType("", "v1", "services", "Service", has_status=True,
                 returns_deleted_object=True, name_rule="dns1035"),
    ResourceType("", "v1", "pods", "Pod", has_status=True, tracks_generation=True,
                 returns_deleted_object=True, field_selectors=_POD_FIELDS),
    ResourceType("", "v1", "events", "Event", field_selectors=_EVENT_FIELDS),
    ResourceType("events.k8s.io", "v1", "events", "Event"),
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy",
                 tracks_generation=True),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease"),
    ResourceType("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                 "MutatingWebhookConfiguration", namespaced=False, tracks_generation=True),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                 "ValidatingWebhookConfiguration", namespaced=False, tracks_generation=True),
    ResourceType("batch.volcano.sh", "v1alpha1", "jobs", "Job", custom=True,
                 has_status=True, tracks_generation=True),
    ResourceType("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", custom=True,
                 has_status=True, tracks_generation=True),
)


# --------------------------------------------------------------------------
# Errors as Status objects
# --------------------------------------------------------------------------


class ApiError(Exception):
    """A failure answered as a ``Status`` object (what the real server sends)."""

    def __init__(self, code: int, reason: str | None, message: str,
                 details: Obj | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details, self.headers = details, headers or {}

    def status(self) -> Obj:
        return status_object(self.code, self.reason, self.message, self.details)


def status_object(code: int, reason: str | None, message: str, details: Obj | None = None) -> Obj:
    """A ``Failure`` Status with the field layout of kube-apiserver."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                 "status": "Failure", "message": message}
    if reason:
        body["reason"] = reason
    if details:
        body["details"] = details
    body["code"] = code
    return body


def _not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{rt.qualified} "{name}" not found',
                    {"name": name, "group": rt.group, "kind": rt.plural})


def _conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}',
                    {"name": name, "group": rt.group, "kind": rt.plural})


_STALE = "the object has been modified; please apply your changes to the latest version and try again"


def _invalid(rt: ResourceType, name: str, causes: list[tuple[str, str]]) -> ApiError:
    """422 Invalid; ``causes`` are (field, message) pairs."""
    text = ", ".join(f"{f}: {m}" for f, m in causes)
    msg = f'{rt.kind}.{rt.group} "{name}" is invalid: ' if rt.group else f'{rt.kind} "{name}" is invalid: '
    msg += f"[{text}]" if len(causes) > 1 else text
    return ApiError(422, "Invalid", msg, {
        "name": name, "group": rt.group, "kind": rt.kind,
        "causes": [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in causes]})


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


_DEFAULT_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
                    405: "MethodNotAllowed", 409: "Conflict", 410: "Expired", 413: "RequestEntityTooLarge",
                    415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
                    500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


# --------------------------------------------------------------------------
# Validation (the subset of apimachinery's rules that products trip over)
# --------------------------------------------------------------------------

_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def _name_errors(rule: str, name: str) -> list[str]:
    if rule == "subdomain":
        if len(name) > 253:
            return ["must be no more than 253 characters"]
        if not _SUBDOMAIN.fullmatch(name):
            return ["a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                    "characters, '-' or '.', and must start and end with an alphanumeric character"]
        return []
    pattern = _LABEL if rule == "label" else _DNS1035
    errors = ["must be no more than 63 characters"] if len(name) > 63 else []
    if not pattern.fullmatch(name):
        errors.append("a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
                      "or '-', and must start and end with an alphanumeric character" if rule == "label" else
                      "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start "
                      "with an alphabetic character, and end with an alphanumeric character")
    return errors


def _key_errors(key: str) -> list[str]:
    prefix, _, name = key.rpartition("/")
    errors = []
    if prefix and (len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix)):
        errors.append("prefix part must be a lowercase RFC 1123 subdomain")
    if len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if not _QUALIFIED.fullmatch(name):
        errors.append("name part must consist of alphanumeric characters, '-', '_' or '.', "
                      "and must start and end with an alphanumeric character")
    return errors


def _validate(rt: ResourceType, obj: Obj) -> None:
    """Raise 422 Invalid for a bad name, label key/value, annotation key or size."""
    meta = obj["metadata"]
    name = meta.get("name") or ""
    causes: list[tuple[str, str]] = []
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    for err in _name_errors(rt.name_rule, name) if name else []:
        causes.append(("metadata.name", f'Invalid value: "{name}": {err}'))
    for key, value in (meta.get("labels") or {}).items():
        for err in _key_errors(key):
            causes.append(("metadata.labels", f'Invalid value: "{key}": {err}'))
        if not isinstance(value, str):
            causes.append((f"metadata.labels[{key}]", "Invalid value: must be a string"))
        elif len(value) > 63:
            causes.append(("metadata.labels", f'Invalid value: "{value}": must be no more than 63 characters'))
        elif value and not _QUALIFIED.fullmatch(value):
            causes.append(("metadata.labels", f'Invalid value: "{value}": a valid label must be an empty '
                           "string or consist of alphanumeric characters, '-', '_' or '.', and must start "
                           "and end with an alphanumeric character"))
    for key in meta.get("annotations") or {}:
        for err in _key_errors(key):
            causes.append(("metadata.annotations", f'Invalid value: "{key}": {err}'))
    if rt.key in (("", "configmaps"), ("", "secrets")):
        size = sum(len(k) + len(str(v)) for part in ("data", "binaryData") for k, v in (obj.get(part) or {}).items())
        if size > 1024 * 1024:
            causes.append(("data", "Too long: must have at most 1048576 bytes"))
    if causes:
        raise _invalid(rt, name, causes)


# --------------------------------------------------------------------------
# Selectors
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    """One selector term: ``key op values`` with op in =, !=, in, notin, exists, !exists."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, fields: dict[str, str]) -> bool:
        present = self.key in fields
        value = fields.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # "!=", "notin"


def _split_terms(selector: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    return [t.strip() for t in terms if t.strip()]


def parse_label_selector(selector: str | None) -> list[Requirement]:
    """Parse a ``labelSelector`` query value; raise 400 BadRequest if malformed."""
    reqs = []
    for term in _split_terms(selector or ""):
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^()]*)\)", term):
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif m := re.fullmatch(r"!\s*([\w./-]+)", term):
            reqs.append(Requirement(m.group(1), "!exists"))
        elif m := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w.-]*)", term):
            reqs.append(Requirement(m.group(1), "!=" if m.group(2) == "!=" else "=", (m.group(3),)))
        elif re.fullmatch(r"[\w./-]+", term):
            reqs.append(Requirement(term, "exists"))
        else:
            raise _bad_request(f"unable to parse requirement: {term!r} in label selector {selector!r}")
    return reqs


def parse_field_selector(rt: ResourceType, selector: str | None) -> list[Requirement]:
    """Parse a ``fieldSelector``; only fields the real server indexes are accepted."""
    allowed = ("metadata.name", "metadata.namespace") + rt.field_selectors
    reqs = []
    for term in _split_terms(selector or ""):
        m = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", term)
        if not m:
            raise _bad_request(f"invalid field selector: {term!r}")
        if m.group(1) not in allowed:
            raise _bad_request(f'"{m.group(1)}" is not a known field selector: only '
                               + ", ".join(f'"{a}"' for a in allowed))
        reqs.append(Requirement(m.group(1), "!=" if m.group(2) == "!=" else "=", (m.group(3),)))
    return reqs


def _field_values(obj: Obj, reqs: list[Requirement]) -> dict[str, str]:
    out = {}
    for req in reqs:
        value: Any = obj
        for part in req.key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        out[req.key] = "" if value is None else str(value)
    return out


@dataclass(frozen=True)
class _Filter:
    """What a list or watch asks for: namespace plus label and field selectors."""

    namespace: str | None
    labels: list[Requirement]
    fields: list[Requirement]

    def matches(self, obj: Obj) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        label_map = meta.get("labels") or {}
        if not all(r.matches(label_map) for r in self.labels):
            return False
        values = _field_values(obj, self.fields)
        return all(r.matches(values) for r in self.fields)


# --------------------------------------------------------------------------
# Patches
# --------------------------------------------------------------------------


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, null deletes, lists replace."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = json_merge_patch(result.get(key), value)
    return result


# List fields merged by key in a strategic merge patch (patchMergeKey in the
# Kubernetes API types); every other list is replaced.  "ports" is keyed by
# containerPort in containers and by port in services.
_MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
               "volumes": "name", "env": "name", "volumeMounts": "mountPath",
               "volumeDevices": "devicePath", "imagePullSecrets": "name", "ownerReferences": "uid",
               "webhooks": "name", "conditions": "type", "hostAliases": "ip",
               "topologySpreadConstraints": "topologyKey", "resourceClaims": "name"}
_UNION_LISTS = {"finalizers"}  # primitive lists with patchStrategy=merge
_DELETE = object()


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch for built-in kinds.

    Keyed lists in ``_MERGE_KEYS`` merge element-wise, ``finalizers`` is a
    union, ``$patch: replace|delete`` and ``$deleteFromPrimitiveList/<field>``
    directives are honoured, ``$setElementOrder``/``$retainKeys`` ignored.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith(("$setElementOrder/", "$retainKeys")) or key == "$patch":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [x for x in result.get(name) or [] if x not in value]
            continue
        current = result.get(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, current if isinstance(current, list) else [], value)
        else:
            merged = strategic_merge_patch(current, value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_list(name: str, current: list[Any], patch: list[Any]) -> list[Any]:
    if name in _UNION_LISTS:
        return current + [x for x in patch if x not in current]
    key = _MERGE_KEYS.get(name)
    if name == "ports":
        key = "containerPort" if any(isinstance(p, dict) and "containerPort" in p
                                     for p in current + patch) else "port"
    if key is None or any(isinstance(p, dict) and p.get("$patch") == "replace" for p in patch):
        return [copy.deepcopy(p) for p in patch if not (isinstance(p, dict) and "$patch" in p)]
    out = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            out.append(copy.deepcopy(item))
            continue
        idx = next((i for i, e in enumerate(out) if isinstance(e, dict) and e.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                del out[idx]
        elif idx is None:
            out.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            out[idx] = strategic_merge_patch(out[idx], item)
    return out


# --------------------------------------------------------------------------
# Storage, history and garbage collection
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class WatchEvent:
    """One committed write, kept for watch replay."""

    rv: int
    resource: tuple[str, str]
    type: str  # ADDED | MODIFIED | DELETED
    object: Obj
    old: Obj | None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


def _drop_empty_meta(obj: Obj) -> None:
    """ObjectMeta fields are ``omitempty``: an empty map or list is stored as absent."""
    meta = obj["metadata"]
    for k in ("labels", "annotations", "ownerReferences", "finalizers"):
        if k in meta and not meta[k]:
            del meta[k]


def _without_rv(obj: Obj) -> Obj:
    out = dict(obj)
    out["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k != "resourceVersion"}
    return out


class _Store:
    """Objects, the global resourceVersion, the event history and the GC.

    Every method must be called with ``lock`` held; ``cond`` (on the same lock)
    is notified after each commit and when watches must end.
    """

    def __init__(self, resources: Iterable[ResourceType], gc: bool, history_limit: int) -> None:
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self.rv = 0
        self.history: list[WatchEvent] = []
        self.history_rvs: list[int] = []
        self.floor = 0  # a watch from rv R is servable iff R >= floor
        self.history_limit = history_limit
        self.gc = gc
        self.epoch = 0  # bumped to end every open watch
        self.next_ip = 0
        for rt in resources:
            self.register(rt)

    def register(self, rt: ResourceType) -> None:
        self.types[(rt.group, rt.version, rt.plural)] = rt
        self.objects.setdefault(rt.key, {})

    def type_of(self, obj: Obj) -> ResourceType:
        group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
        for rt in self.types.values():
            if (rt.group, rt.version, rt.kind) == (group, version, obj.get("kind")):
                return rt
        raise ValueError(f"no resource registered for {obj.get('apiVersion')} {obj.get('kind')}")

    def rt_by_key(self, key: tuple[str, str]) -> ResourceType:
        return next(rt for rt in self.types.values() if rt.key == key)

    # -- commits -----------------------------------------------------------

    def commit(self, rt: ResourceType, kind: str, obj: Obj, old: Obj | None) -> Obj:
        """Store (or remove, for DELETED) ``obj`` at a new resourceVersion and record the event."""
        self.rv += 1
        _drop_empty_meta(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if kind == "DELETED":
            self.objects[rt.key].pop(key, None)
        else:
            self.objects[rt.key][key] = obj
        self.history.append(WatchEvent(self.rv, rt.key, kind, copy.deepcopy(obj), copy.deepcopy(old)))
        self.history_rvs.append(self.rv)
        if len(self.history) > self.history_limit:
            drop = len(self.history) - self.history_limit
            self.floor = self.history_rvs[drop - 1]
            del self.history[:drop], self.history_rvs[:drop]
        self.cond.notify_all()
        return copy.deepcopy(obj)

    def expire(self, bump: bool) -> None:
        """Forget the history: every resourceVersion known so far becomes too old (if ``bump``)."""
        if bump:
            self.rv += 1
        self.history.clear()
        self.history_rvs.clear()
        self.floor = self.rv
        self.cond.notify_all()

    def events_after(self, rv: int) -> list[WatchEvent]:
        return self.history[bisect.bisect_right(self.history_rvs, rv):]

    # -- deletion and garbage collection -------------------------------------

    def remove(self, rt: ResourceType, obj: Obj, policy: str = "Background", collect: bool = True) -> Obj:
        """Delete now, or mark for deletion if finalizers remain; then let the GC act (if ``collect``)."""
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return copy.deepcopy(obj)
            new = copy.deepcopy(obj)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if rt.tracks_generation:
                new["metadata"]["generation"] = meta.get("generation", 0) + 1
            return self.commit(rt, "MODIFIED", new, obj)
        if self.gc and policy == "Foreground":
            for dep_rt, dep in self.dependents(meta.get("uid")):
                self.remove(dep_rt, dep, "Foreground", collect=False)
        if self.gc and policy == "Orphan":
            for dep_rt, dep in self.dependents(meta.get("uid")):
                new = copy.deepcopy(dep)
                new["metadata"]["ownerReferences"] = [r for r in dep["metadata"]["ownerReferences"]
                                                      if r.get("uid") != meta.get("uid")]
                self.commit(dep_rt, "MODIFIED", new, dep)
        if rt.key == ("", "namespaces"):
            for other, objs in self.objects.items():
                for (ns, _), o in list(objs.items()):
                    if ns == meta["name"] and other != rt.key:
                        self.commit(self.rt_by_key(other), "DELETED", copy.deepcopy(o), o)
        gone = self.commit(rt, "DELETED", copy.deepcopy(obj), obj)
        if collect:
            self.collect_garbage()
        return gone

    def dependents(self, uid: str | None) -> list[tuple[ResourceType, Obj]]:
        out = []
        for key, objs in self.objects.items():
            for obj in objs.values():
                if any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or []):
                    out.append((self.rt_by_key(key), obj))
        return out

    def collect_garbage(self) -> None:
        """If the GC is on: delete objects whose owners are all gone, strip dangling references."""
        if not self.gc:
            return
        changed = True
        while changed:
            changed = False
            uids = {o["metadata"].get("uid") for objs in self.objects.values() for o in objs.values()}
            for key, objs in list(self.objects.items()):
                for okey, obj in list(objs.items()):
                    if objs.get(okey) is not obj:
                        continue  # already collected in this pass
                    refs = obj["metadata"].get("ownerReferences") or []
                    alive = [r for r in refs if r.get("uid") in uids]
                    if len(alive) == len(refs) or obj["metadata"].get("deletionTimestamp"):
                        continue
                    rt = self.rt_by_key(key)
                    if alive:
                        new = copy.deepcopy(obj)
                        new["metadata"]["ownerReferences"] = alive
                        self.commit(rt, "MODIFIED", new, obj)
                    else:
                        self.remove(rt, obj, "Background", collect=False)
                    changed = True


# --------------------------------------------------------------------------
# Server-side defaulting (the part of it that shows up in tests)
# --------------------------------------------------------------------------


def _apply_defaults(store: _Store, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
    """Apply the real server's defaulting and conversions that a product can observe."""
    if rt.key == ("", "secrets"):
        obj.setdefault("type", "Opaque")
        for k, v in (obj.pop("stringData", None) or {}).items():
            obj.setdefault("data", {})[k] = base64.b64encode(str(v).encode()).decode()
    elif rt.key == ("", "services"):
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        if spec["type"] != "ExternalName":
            if old is not None and not spec.get("clusterIP"):
                spec["clusterIP"] = old.get("spec", {}).get("clusterIP")
                spec["clusterIPs"] = old.get("spec", {}).get("clusterIPs")
            if not spec.get("clusterIP"):
                store.next_ip += 1
                spec["clusterIP"] = f"10.96.{store.next_ip // 250}.{store.next_ip % 250 + 1}"
            spec.setdefault("clusterIPs", [spec["clusterIP"]])
            spec.setdefault("ipFamilies", ["IPv4"])
            spec.setdefault("ipFamilyPolicy", "SingleStack")
            spec.setdefault("internalTrafficPolicy", "Cluster")
            if old is not None and old.get("spec", {}).get("clusterIP") not in (None, spec["clusterIP"]):
                raise _invalid(rt, obj["metadata"]["name"], [(
                    "spec.clusterIPs[0]", f'Invalid value: ["{spec["clusterIP"]}"]: may not change once set')])
    elif rt.key == ("", "pods"):
        spec = obj.setdefault("spec", {})
        for k, v in (("restartPolicy", "Always"), ("dnsPolicy", "ClusterFirst"),
                     ("schedulerName", "default-scheduler"), ("terminationGracePeriodSeconds", 30),
                     ("enableServiceLinks", True), ("securityContext", {})):
            spec.setdefault(k, v)
        for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
            image = str(c.get("image", ""))
            c.setdefault("imagePullPolicy", "Always" if image.endswith(":latest") or ":" not in
                         image.rsplit("/", 1)[-1] else "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("resources", {})
            for port in c.get("ports") or []:
                port.setdefault("protocol", "TCP")
    elif rt.key == ("", "namespaces"):
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"].get("name")
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])


def _initial_status(rt: ResourceType) -> Obj | None:
    return {("", "pods"): {"phase": "Pending"}, ("", "services"): {"loadBalancer": {}},
            ("", "namespaces"): {"phase": "Active"}}.get(rt.key)


# --------------------------------------------------------------------------
# Fault injection and request log
# --------------------------------------------------------------------------


@dataclass
class Fault:
    """A pending injected failure; ``remaining`` counts down as requests match."""

    remaining: int
    action: Literal["fail", "drop"]
    status: int = 500
    method: str | None = None
    path_contains: str | None = None
    verb: str | None = None
    retry_after: int | None = None
    reason: str | None = None
    message: str | None = None

    def matches(self, method: str, target: str, verb: str) -> bool:
        return (self.remaining > 0
                and (self.method is None or self.method.upper() == method)
                and (self.path_contains is None or self.path_contains in target)
                and (self.verb is None or self.verb == verb))


@dataclass
class RequestRecord:
    """One request as the server saw it, with its Kubernetes verb and resource.

    ``verb`` is get, list, watch, create, update, patch, delete or
    deletecollection for resource requests, get for discovery (``resource``
    empty).  ``status`` is the HTTP status answered, 0 for a dropped
    connection.
    """

    method: str
    path: str
    query: dict[str, str]
    verb: str
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str | None = None
    name: str | None = None
    status: int | None = None

    @property
    def rbac_resource(self) -> str:
        """The resource as an RBAC rule names it: ``pods`` or ``jobs/status``."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass
class _Route:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool  # the deprecated /watch/ prefix


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


# --------------------------------------------------------------------------
# HTTP plumbing
# --------------------------------------------------------------------------


class _HTTPServer(http.server.ThreadingHTTPServer):
    """A ThreadingHTTPServer whose connection threads the FakeApiServer tracks and ends."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], api: FakeApiServer) -> None:
        self.api = api
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        def run() -> None:
            try:
                self.process_request_thread(request, client_address)
            finally:
                self.api._untrack(request)

        thread = threading.Thread(target=run, daemon=True,
                                  name=f"fake-apiserver-conn:{self.server_address[1]}")
        self.api._track(request, thread)
        thread.start()


class _Handler(http.server.BaseHTTPRequestHandler):
    """Reads a request, hands it to the FakeApiServer, writes JSON or a chunked stream."""

    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence stderr
        pass

    def do_GET(self) -> None:
        self.server.api._handle(self, "GET")

    def do_POST(self) -> None:
        self.server.api._handle(self, "POST")

    def do_PUT(self) -> None:
        self.server.api._handle(self, "PUT")

    def do_PATCH(self) -> None:
        self.server.api._handle(self, "PATCH")

    def do_DELETE(self) -> None:
        self.server.api._handle(self, "DELETE")

    def read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if not isinstance(body, bytes) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Audit-Id", str(uuid.uuid4()))
        self.end_headers()

    def write_event(self, event: Obj) -> None:
        data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True

    def client_gone(self) -> bool:
        """True once the client has closed its end (a watch has nothing else to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


class FakeApiServer:
    """A Kubernetes API server double on http://127.0.0.1:<port> (see the module docstring).

    Args:
        gc: run a synchronous garbage collector over ownerReferences (uid based).
        history_limit: watch events retained; older resourceVersions get 410 Expired.
        bookmark_interval: seconds between BOOKMARK events on watches that allow them.
        watch_timeout: seconds a watch lasts when the client sends no timeoutSeconds.
        namespaces: Namespace objects that exist from the start.
        strict_namespaces: refuse (404) to create objects in a namespace that does not
            exist, as the real server does; off by default so tests need not create them.
        resources: the resource types served; extend with ``register_resource``.
        port: a fixed port, or 0 for an ephemeral one.
    """

    too_large_rv_wait = 3.0  # seconds a watch waits for a future resourceVersion, as the real server

    def __init__(self, *, gc: bool = False, history_limit: int = 10_000,
                 bookmark_interval: float = 60.0, watch_timeout: float = 1800.0,
                 namespaces: Iterable[str] = ("default", "kube-system", "kube-public", "kube-node-lease"),
                 strict_namespaces: bool = False,
                 resources: Iterable[ResourceType] = DEFAULT_RESOURCES, port: int = 0) -> None:
        self._store = _Store(resources, gc, history_limit)
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.strict_namespaces = strict_namespaces
        self.port = port
        self._httpd: _HTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._conns: dict[Any, threading.Thread] = {}
        self._conn_lock = threading.Lock()
        self._faults: list[Fault] = []
        self._requests: list[RequestRecord] = []
        self._log_lock = threading.Lock()
        self._stopping = False
        self._open_watches = 0
        for ns in namespaces:
            self.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns},
                             "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> FakeApiServer:
        """Listen on 127.0.0.1:``port`` (ephemeral the first time) and serve in the background."""
        if self._httpd is not None:
            return self
        self._stopping = False
        self._httpd = _HTTPServer(("127.0.0.1", self.port), self)
        self.port = self._httpd.server_address[1]
        self._serve_thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                              name=f"fake-apiserver:{self.port}", daemon=True)
        self._serve_thread.start()
        return self

    def stop(self) -> None:
        """End every watch (cleanly), close every connection, join every server thread."""
        if self._httpd is None:
            return
        with self._store.cond:
            self._stopping = True
            self._store.epoch += 1
            self._store.cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        deadline = time.monotonic() + 1.0
        with self._store.cond:  # give watch streams a moment to write their last chunk
            while self._open_watches and time.monotonic() < deadline:
                self._store.cond.wait(0.05)
        with self._conn_lock:
            conns = list(self._conns.items())
        for sock, _ in conns:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for _, thread in conns:
            thread.join(timeout=2.0)
        assert self._serve_thread is not None
        self._serve_thread.join(timeout=2.0)
        self._httpd = self._serve_thread = None

    def restart(self, *, keep_history: bool = False) -> None:
        """Go away and come back on the same port with the same objects.

        Like a real restart, the watch history is lost unless ``keep_history``:
        a watch from an older resourceVersion then gets 410 Expired, one from
        the current resourceVersion resumes.
        """
        self.stop()
        if not keep_history:
            with self._store.lock:
                self._store.expire(bump=False)
        self.start()

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- client configuration -------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configuration(self) -> kubernetes.client.Configuration:
        """A client Configuration for this server (no auth, no proxy)."""
        config = kubernetes.client.Configuration(host=self.url)
        config.proxy = None
        return config

    def api_client(self) -> kubernetes.client.ApiClient:
        """A fresh ``kubernetes.client.ApiClient`` talking to this server."""
        return kubernetes.client.ApiClient(self.configuration())

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig whose current context points here; return ``path``."""
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
               "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
               "users": [{"name": "fake", "user": {}}],
               "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                         "namespace": "default"}}]}
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump(doc, fh)
        return path

    # -- fault injection ------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 500, *, method: str | None = None,
                  path_contains: str | None = None, verb: str | None = None,
                  retry_after: int | None = None, reason: str | None = None,
                  message: str | None = None) -> Fault:
        """Answer the next ``n`` matching requests with a Status error instead of serving them.

        ``path_contains`` is matched against the request target (path and query),
        ``verb`` against the Kubernetes verb.  ``retry_after`` adds a
        ``Retry-After`` header and ``details.retryAfterSeconds``.
        """
        fault = Fault(n, "fail", status, method, path_contains, verb, retry_after, reason, message)
        with self._log_lock:
            self._faults.append(fault)
        return fault

    def drop_next(self, n: int = 1, *, method: str | None = None, path_contains: str | None = None,
                  verb: str | None = None) -> Fault:
        """Close the connection of the next ``n`` matching requests without any response."""
        fault = Fault(n, "drop", 0, method, path_contains, verb)
        with self._log_lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._log_lock:
            self._faults.clear()

    def close_watches(self) -> int:
        """End every open watch stream now (cleanly); return how many were open."""
        with self._store.cond:
            count = self._open_watches
            self._store.epoch += 1
            self._store.cond.notify_all()
        return count

    def expire_history(self) -> None:
        """Make every resourceVersion handed out so far too old to watch from (410 Expired).

        The global resourceVersion moves on by one, so a fresh list returns a
        watchable resourceVersion, as after an etcd compaction.
        """
        with self._store.lock:
            self._store.expire(bump=True)

    def send_bookmarks(self) -> None:
        """Make every watch that allows bookmarks send one now."""
        with self._store.cond:
            self._bookmark_now = time.monotonic()
            self._store.cond.notify_all()

    _bookmark_now = 0.0

    # -- introspection and seeding -------------------------------------------

    @property
    def gc(self) -> bool:
        return self._store.gc

    @gc.setter
    def gc(self, enabled: bool) -> None:
        self._store.gc = enabled

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        return self._store.rv

    @property
    def requests(self) -> list[RequestRecord]:
        """A copy of the request log, oldest first."""
        with self._log_lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._log_lock:
            self._requests.clear()

    def permissions_used(self) -> set[tuple[str, str, str]]:
        """(apiGroup, resource[/subresource], verb) for every resource request seen."""
        return {(r.group, r.rbac_resource, r.verb) for r in self.requests if r.resource}

    @property
    def open_watches(self) -> int:
        return self._open_watches

    def wait_for_watches(self, count: int = 1, timeout: float = 5.0) -> bool:
        """Block until at least ``count`` watch streams are open; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._store.cond:
            while self._open_watches < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._store.cond.wait(left)
        return True

    def register_resource(self, rt: ResourceType) -> None:
        """Serve one more resource type (e.g. another CRD)."""
        with self._store.lock:
            self._store.register(rt)

    def resource(self, resource: str) -> ResourceType:
        """Resolve ``plural`` or ``plural.group`` (``events`` means core events)."""
        types = list(self._store.types.values())
        exact = [rt for rt in types if rt.qualified == resource]
        by_plural = [rt for rt in types if rt.plural == resource]
        found = exact or [rt for rt in by_plural if rt.group == ""] or by_plural
        if len(found) != 1:
            raise ValueError(f"unknown or ambiguous resource {resource!r}")
        return found[0]

    def objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """Copies of the stored objects of ``resource`` (sorted by namespace, name)."""
        rt = self.resource(resource)
        with self._store.lock:
            objs = self._store.objects[rt.key]
            return [copy.deepcopy(objs[k]) for k in sorted(objs) if namespace is None or k[0] == namespace]

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        rt = self.resource(resource)
        with self._store.lock:
            obj = self._store.objects[rt.key].get(((namespace or "") if rt.namespaced else "", name))
            return copy.deepcopy(obj) if obj else None

    def put_object(self, obj: Obj) -> Obj:
        """Store ``obj`` as is (create or overwrite), as another client would; return the stored copy.

        Fills uid, creationTimestamp, namespace ("default") and generation if
        missing, keeps status, skips validation, defaulting and the GC, and
        emits the ADDED/MODIFIED watch event.
        """
        with self._store.lock:
            rt = self._store.type_of(obj)
            new = copy.deepcopy(obj)
            meta = new.setdefault("metadata", {})
            if rt.namespaced:
                meta.setdefault("namespace", "default")
            else:
                meta.pop("namespace", None)
            old = self._store.objects[rt.key].get((meta.get("namespace", ""), meta["name"]))
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            if rt.tracks_generation:
                meta.setdefault("generation", 1)
            return self._store.commit(rt, "MODIFIED" if old else "ADDED", new, old)

    def delete_object(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        """Remove an object at once (finalizers ignored), emit DELETED, run the GC if on."""
        rt = self.resource(resource)
        with self._store.lock:
            old = self._store.objects[rt.key].get(((namespace or "") if rt.namespaced else "", name))
            if old is None:
                return None
            gone = self._store.commit(rt, "DELETED", copy.deepcopy(old), old)
            self._store.collect_garbage()
            return gone

    # -- connection tracking (called by _HTTPServer) --------------------------

    def _track(self, sock: Any, thread: threading.Thread) -> None:
        with self._conn_lock:
            self._conns[sock] = thread

    def _untrack(self, sock: Any) -> None:
        with self._conn_lock:
            self._conns.pop(sock, None)

    # -- request handling -----------------------------------------------------

    def _handle(self, h: _Handler, method: str) -> None:
        split = urlsplit(h.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        body = h.read_body()
        record = RequestRecord(method, split.path, query, "get")
        route: _Route | Obj | bytes | ApiError
        try:
            route = self._route(split.path)
        except ApiError as err:
            route = err
        if isinstance(route, _Route):
            record = self._describe(record, route)
        with self._log_lock:
            self._requests.append(record)
            fault = next((f for f in self._faults if f.matches(method, h.path, record.verb)), None)
            if fault:
                fault.remaining -= 1
        if fault and fault.action == "drop":
            record.status = 0
            h.close_connection = True
            return
        if fault:
            err = ApiError(fault.status, fault.reason or _DEFAULT_REASONS.get(fault.status, "InternalError"),
                           fault.message or f"injected failure ({fault.status})")
            if fault.retry_after is not None:
                err.details = {"retryAfterSeconds": fault.retry_after}
                err.headers["Retry-After"] = str(fault.retry_after)
            return self._send_error(h, record, err)
        try:
            if isinstance(route, ApiError):
                raise route
            if not isinstance(route, _Route):  # discovery or health
                record.status = 200
                return h.send_json(200, route)
            if record.verb == "watch":
                record.status = 200
                return self._watch(h, route, query)
            code, result = self._serve(method, route, query, body, h.headers.get("Content-Type") or "")
            record.status = code
            h.send_json(code, result)
        except ApiError as err:
            self._send_error(h, record, err)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
        except Exception as exc:  # a bug here should read as a 500, not a hang
            self._send_error(h, record, ApiError(500, "InternalError", f"fake apiserver: {exc!r}"))

    def _send_error(self, h: _Handler, record: RequestRecord, err: ApiError) -> None:
        record.status = err.code
        h.send_json(err.code, err.status(), err.headers)

    @staticmethod
    def _describe(record: RequestRecord, route: _Route) -> RequestRecord:
        rt, method = route.rt, record.method
        watching = route.watch_path or _truthy(record.query.get("watch"))
        if method == "GET":
            verb = "watch" if watching else ("get" if route.name else "list")
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch",
                    "DELETE": "delete" if route.name else "deletecollection"}[method]
        return RequestRecord(method, record.path, record.query, verb, rt.group, rt.version, rt.plural,
                             route.subresource or "", route.namespace, route.name)

    def _route(self, path: str) -> _Route | Obj | bytes:
        """Map a URL path to a resource route, or to a discovery / health document."""
        parts = [unquote(p) for p in path.strip("/").split("/") if p]
        if parts in (["healthz"], ["livez"], ["readyz"]):
            return b"ok"
        if parts == ["version"]:
            return {"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "gitCommit": "0" * 40,
                    "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                    "compiler": "gc", "platform": "linux/amd64"}
        types = self._store.types.values()
        if parts == ["api"]:
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}]}
        if parts == ["apis"]:
            groups: dict[str, list[str]] = {}
            for rt in types:
                if rt.group and rt.version not in groups.setdefault(rt.group, []):
                    groups[rt.group].append(rt.version)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in groups.items()]}
        if len(parts) >= 2 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            return self._resource_list(group, version)
        watch_path = rest[0] == "watch"
        rest = rest[1:] if watch_path else rest
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        rt = self._store.types.get((group, version, rest[0] if rest else ""))
        if (rt is None or len(rest) > 3 or (namespace is not None and not rt.namespaced)
                or (rt.namespaced and namespace is None and len(rest) > 1)
                or (len(rest) == 3 and not (rest[2] == "status" and rt.has_status))):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _Route(rt, namespace, rest[1] if len(rest) > 1 else None,
                      rest[2] if len(rest) > 2 else None, watch_path)

    def _resource_list(self, group: str, version: str) -> Obj:
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        resources = []
        for rt in self._store.types.values():
            if (rt.group, rt.version) == (group, version):
                resources.append({"name": rt.plural, "singularName": rt.kind.lower(),
                                  "namespaced": rt.namespaced, "kind": rt.kind, "verbs": verbs})
                if rt.has_status:
                    resources.append({"name": f"{rt.plural}/status", "singularName": "",
                                      "namespaced": rt.namespaced, "kind": rt.kind,
                                      "verbs": ["get", "patch", "update"]})
        if not resources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": resources}

    # -- verbs ------------------------------------------------------------------

    def _serve(self, method: str, route: _Route, query: dict[str, str], raw: bytes,
               content_type: str) -> tuple[int, Obj]:
        rt, ns, name, sub = route.rt, route.namespace, route.name, route.subresource
        dry_run = bool(query.get("dryRun"))
        with self._store.lock:
            if method == "GET" and name:
                return 200, self._present(rt, self._get(rt, ns, name))
            if method == "GET":
                return 200, self._list(rt, ns, query)
            if method == "POST" and not name and (ns is not None or not rt.namespaced):
                obj = self._create(rt, ns, _parse_json(raw, dict), dry_run)
                return 201, self._present(rt, obj)
            if method == "PUT" and name:
                return 200, self._present(rt, self._update(rt, ns, name, sub, _parse_json(raw, dict), dry_run))
            if method == "PATCH" and name:
                return self._patch(rt, ns, name, sub, raw, content_type, query, dry_run)
            if method == "DELETE" and name:
                return self._delete(rt, ns, name, raw, query, dry_run)
            if method == "DELETE":
                listing = self._list(rt, ns, query)
                for item in listing["items"]:
                    meta = item["metadata"]
                    self._delete(rt, meta.get("namespace"), meta["name"], raw, query, dry_run)
                return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    @staticmethod
    def _present(rt: ResourceType, obj: Obj) -> Obj:
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        return obj

    def _get(self, rt: ResourceType, ns: str | None, name: str) -> Obj:
        obj = self._store.objects[rt.key].get((ns or "", name))
        if obj is None:
            raise _not_found(rt, name)
        return copy.deepcopy(obj)

    def _list(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> Obj:
        flt = _Filter(ns, parse_label_selector(query.get("labelSelector")),
                      parse_field_selector(rt, query.get("fieldSelector")))
        objs = self._store.objects[rt.key]
        keys = [k for k in sorted(objs) if flt.matches(objs[k])]
        meta: Obj = {"resourceVersion": str(self._store.rv)}
        if token := query.get("continue"):
            try:
                state = json.loads(base64.urlsafe_b64decode(token))
                keys = [k for k in keys if list(k) > state["after"]]
                meta["resourceVersion"] = state["rv"]
            except (ValueError, KeyError, TypeError):
                raise _bad_request("continue key is not valid: incorrect encoded start resourceVersion") from None
        limit = int(query.get("limit") or 0)
        if 0 < limit < len(keys):
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                {"rv": meta["resourceVersion"], "after": list(keys[limit - 1])}).encode()).decode()
            meta["remainingItemCount"] = len(keys) - limit
            keys = keys[:limit]
        items = []
        for k in keys:
            item = copy.deepcopy(objs[k])
            if not rt.custom:  # the real server omits TypeMeta on built-in list items
                item.pop("kind", None)
                item.pop("apiVersion", None)
            items.append(item)
        return {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items}

    def _check_type(self, rt: ResourceType, obj: Obj) -> None:
        if obj.get("apiVersion") not in (None, "", rt.api_version):
            raise _bad_request(f"the API version in the data ({obj['apiVersion']}) does not match the "
                               f"expected API version ({rt.api_version})")
        if obj.get("kind") not in (None, "", rt.kind):
            raise _bad_request(f"the kind in the data ({obj['kind']}) does not match the expected kind ({rt.kind})")
        obj["kind"], obj["apiVersion"] = rt.kind, rt.api_version
        if not isinstance(obj.setdefault("metadata", {}), dict):
            raise _bad_request("metadata must be an object")

    def _check_namespace(self, rt: ResourceType, obj: Obj, ns: str | None) -> None:
        meta = obj["metadata"]
        if not rt.namespaced:
            meta.pop("namespace", None)
        elif meta.get("namespace") not in (None, "", ns):
            raise _bad_request("the namespace of the provided object does not match the namespace sent on the request")
        else:
            meta["namespace"] = ns

    def _create(self, rt: ResourceType, ns: str | None, body: Obj, dry_run: bool) -> Obj:
        obj = copy.deepcopy(body)
        self._check_type(rt, obj)
        self._check_namespace(rt, obj, ns)
        meta = obj["metadata"]
        try:
            if int(meta.get("resourceVersion") or 0) != 0:
                raise ApiError(500, None, "resourceVersion should not be set on objects to be created")
        except ValueError:
            pass
        if not meta.get("name") and meta.get("generateName"):
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            meta["name"] = meta["generateName"] + "".join(random.choice(alphabet) for _ in range(5))
        _validate(rt, obj)
        store = self._store
        if (ns or "", meta["name"]) in store.objects[rt.key]:
            raise ApiError(409, "AlreadyExists", f'{rt.qualified} "{meta["name"]}" already exists',
                           {"name": meta["name"], "group": rt.group, "kind": rt.plural})
        if rt.namespaced and self.strict_namespaces and ("", ns) not in store.objects[("", "namespaces")]:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
        for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        if rt.tracks_generation:
            meta["generation"] = 1
        if rt.has_status:
            obj.pop("status", None)
            if (status := _initial_status(rt)) is not None:
                obj["status"] = status
        _apply_defaults(store, rt, obj, None)
        if dry_run:
            return obj
        created = store.commit(rt, "ADDED", obj, None)
        store.collect_garbage()
        return created

    def _update(self, rt: ResourceType, ns: str | None, name: str, sub: str | None, body: Obj,
                dry_run: bool, current: Obj | None = None) -> Obj:
        current = current or self._get(rt, ns, name)
        obj = copy.deepcopy(body)
        self._check_type(rt, obj)
        self._check_namespace(rt, obj, ns)
        meta, cur_meta = obj["metadata"], current["metadata"]
        if meta.get("name") not in (None, "", name):
            raise _bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        meta["name"] = name
        if meta.get("resourceVersion") and meta["resourceVersion"] != cur_meta["resourceVersion"]:
            raise _conflict(rt, name, _STALE)
        if meta.get("uid") and meta["uid"] != cur_meta["uid"]:
            raise _conflict(rt, name, f"Precondition failed: UID in precondition: {meta['uid']}, "
                            f"UID in object meta: {cur_meta['uid']}")
        if sub == "status":
            new = copy.deepcopy(current)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
        else:
            new = obj
            for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
                if k in cur_meta:
                    meta[k] = cur_meta[k]
                else:
                    meta.pop(k, None)
            if rt.has_status:
                new.pop("status", None)
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
            _apply_defaults(self._store, rt, new, current)
            _validate(rt, new)
            if cur_meta.get("deletionTimestamp") and not set(meta.get("finalizers") or []) <= set(
                    cur_meta.get("finalizers") or []):
                raise _invalid(rt, name, [("metadata.finalizers",
                                           "Forbidden: no new finalizers can be added if the object is being deleted")])
        new["metadata"]["resourceVersion"] = cur_meta["resourceVersion"]
        if rt.tracks_generation and _spec_part(new) != _spec_part(current):
            new["metadata"]["generation"] = cur_meta.get("generation", 0) + 1
        _drop_empty_meta(new)
        if _without_rv(new) == _without_rv(current) or dry_run:
            return new  # a no-op write is not a write: same resourceVersion, no event
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            gone = self._store.commit(rt, "DELETED", new, current)
            self._store.collect_garbage()
            return gone
        updated = self._store.commit(rt, "MODIFIED", new, current)
        self._store.collect_garbage()
        return updated

    def _patch(self, rt: ResourceType, ns: str | None, name: str, sub: str | None, raw: bytes,
               content_type: str, query: dict[str, str], dry_run: bool) -> tuple[int, Obj]:
        ctype = content_type.split(";")[0].strip().lower()
        accepted = ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]
        if not rt.custom:
            accepted.insert(2, "application/strategic-merge-patch+json")
        if ctype not in accepted:
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: " + ", ".join(accepted))
        if ctype == "application/apply-patch+yaml":
            if not query.get("fieldManager"):
                raise _bad_request("fieldManager is required for apply requests")
            try:
                patch = yaml.safe_load(raw.decode() or "{}")
            except yaml.YAMLError as exc:
                raise _bad_request(f"error decoding YAML: {exc}") from None
            if not isinstance(patch, dict):
                raise _bad_request("the apply configuration must be an object")
            if (ns or "", name) not in self._store.objects[rt.key]:
                patch.setdefault("metadata", {}).setdefault("name", name)
                return 201, self._present(rt, self._create(rt, ns, patch, dry_run))
        current = self._get(rt, ns, name)
        if ctype == "application/json-patch+json":
            ops = _parse_json(raw, list)
            try:
                result = jsonpatch.apply_patch(current, ops)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {exc}") from None
        elif ctype == "application/strategic-merge-patch+json":
            result = strategic_merge_patch(current, _parse_json(raw, dict))
        elif ctype == "application/merge-patch+json":
            result = json_merge_patch(current, _parse_json(raw, dict))
        else:
            result = json_merge_patch(current, patch)
        if not isinstance(result, dict):
            raise _bad_request("the patch did not produce an object")
        # a metadata.resourceVersion left in the result is a precondition, checked by _update
        return 200, self._present(rt, self._update(rt, ns, name, sub, result, dry_run, current))

    def _delete(self, rt: ResourceType, ns: str | None, name: str, raw: bytes, query: dict[str, str],
                dry_run: bool) -> tuple[int, Obj]:
        options = _parse_json(raw, dict) if raw.strip() else {}
        current = self._get(rt, ns, name)
        pre = options.get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != current["metadata"]["uid"]:
            raise _conflict(rt, name, f"Precondition failed: UID in precondition: {pre['uid']}, "
                            f"UID in object meta: {current['metadata']['uid']}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != current["metadata"]["resourceVersion"]:
            raise _conflict(rt, name, f"Precondition failed: ResourceVersion in precondition: "
                            f"{pre['resourceVersion']}, ResourceVersion in object meta: "
                            f"{current['metadata']['resourceVersion']}")
        policy = options.get("propagationPolicy") or query.get("propagationPolicy")
        if options.get("orphanDependents") is True:
            policy = "Orphan"
        if dry_run or options.get("dryRun"):
            return 200, self._present(rt, current)
        result = self._store.remove(rt, self._store.objects[rt.key][(ns or "", name)], policy or "Background")
        if rt.returns_deleted_object or (ns or "", name) in self._store.objects[rt.key]:
            return 200, self._present(rt, result)
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                     "details": {"name": name, "group": rt.group, "kind": rt.plural,
                                 "uid": current["metadata"]["uid"]}}

    # -- watch ------------------------------------------------------------------

    def _watch(self, h: _Handler, route: _Route, query: dict[str, str]) -> None:
        """Stream watch events until timeout, close_watches(), stop() or the client leaves."""
        rt = route.rt
        flt = _Filter(route.namespace, parse_label_selector(query.get("labelSelector")),
                      parse_field_selector(rt, query.get("fieldSelector")))
        if route.name:
            flt.fields.append(Requirement("metadata.name", "=", (route.name,)))
        rv_param = query.get("resourceVersion") or ""
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        initial_events = _truthy(query.get("sendInitialEvents"))
        timeout = float(query.get("timeoutSeconds") or self.watch_timeout)
        if rv_param and not rv_param.isdigit():
            raise _bad_request(f"invalid resource version: {rv_param}")
        store = self._store
        error: Obj | None = None
        initial: list[Obj] = []
        with store.cond:
            epoch = store.epoch
            if rv_param in ("", "0") or initial_events:
                objs = store.objects[rt.key]
                initial = [self._present(rt, copy.deepcopy(objs[k])) for k in sorted(objs) if flt.matches(objs[k])]
                cursor = store.rv
            else:
                cursor = int(rv_param)
                waited = time.monotonic() + self.too_large_rv_wait
                while cursor > store.rv and time.monotonic() < waited:
                    store.cond.wait(waited - time.monotonic())
                if cursor < store.floor:
                    error = status_object(410, "Expired", f"too old resource version: {cursor} ({store.floor})")
                elif cursor > store.rv:
                    error = status_object(504, "Timeout", f"Too large resource version: {cursor}, current: "
                                          f"{store.rv}", {"retryAfterSeconds": 1})
            self._open_watches += 1
            store.cond.notify_all()
        try:
            h.start_stream()
            if error:
                h.write_event({"type": "ERROR", "object": error})
                return
            for obj in initial:
                h.write_event({"type": "ADDED", "object": obj})
            if initial_events and bookmarks:
                h.write_event(self._bookmark(rt, cursor, initial_end=True))
            self._stream(h, rt, flt, cursor, epoch, timeout, bookmarks)
        except OSError:
            pass
        finally:
            h.end_stream()
            with store.cond:
                self._open_watches -= 1
                store.cond.notify_all()

    def _stream(self, h: _Handler, rt: ResourceType, flt: _Filter, cursor: int, epoch: int,
                timeout: float, bookmarks: bool) -> None:
        store = self._store
        start = time.monotonic()
        deadline = start + timeout
        next_bookmark = start + self.bookmark_interval
        last_forced = self._bookmark_now
        while True:
            with store.cond:
                while True:
                    now = time.monotonic()
                    if self._stopping or store.epoch != epoch or cursor < store.floor:
                        return  # closed, stopped, or fell out of the history (the client re-watches)
                    events = store.events_after(cursor)
                    forced = self._bookmark_now != last_forced
                    if events or now >= deadline or forced or (bookmarks and now >= next_bookmark):
                        break
                    store.cond.wait(min(0.25, deadline - now))
                    if h.client_gone():
                        return
                last_forced = self._bookmark_now
            for ev in events:
                cursor = ev.rv
                if ev.resource != rt.key:
                    continue
                kind = self._translate(ev, flt)
                if kind:
                    h.write_event({"type": kind, "object": self._present(rt, copy.deepcopy(ev.object))})
            now = time.monotonic()
            if bookmarks and (forced or now >= next_bookmark or now >= deadline):
                h.write_event(self._bookmark(rt, cursor))
                next_bookmark = now + self.bookmark_interval
            if now >= deadline:
                return

    @staticmethod
    def _translate(ev: WatchEvent, flt: _Filter) -> str | None:
        """The event type this watcher sees: selectors turn MODIFIED into ADDED/DELETED."""
        new_ok = flt.matches(ev.object)
        if ev.type != "MODIFIED":
            return ev.type if new_ok else None
        old_ok = ev.old is not None and flt.matches(ev.old)
        if new_ok:
            return "MODIFIED" if old_ok else "ADDED"
        return "DELETED" if old_ok else None

    @staticmethod
    def _bookmark(rt: ResourceType, rv: int, initial_end: bool = False) -> Obj:
        meta: Obj = {"resourceVersion": str(rv), "creationTimestamp": None}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"type": "BOOKMARK", "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta}}


def _parse_json(raw: bytes, expected: type) -> Any:
    try:
        value = json.loads(raw or b"null")
    except ValueError as exc:
        raise _bad_request(f"error decoding request body: {exc}") from None
    if not isinstance(value, expected):
        raise _bad_request(f"the request body must be a JSON {'object' if expected is dict else 'array'}")
    return value
