"""A thin, typed layer over ``AdmissionReview`` (``admission.k8s.io/v1`` and ``v1beta1``).

Like controller-runtime's ``pkg/webhook/admission``: :func:`parse_review` turns a decoded body into
an :class:`AdmissionRequest` or raises :class:`ReviewError`; handlers return an
:class:`AdmissionResponse`; :func:`review_response` wraps it in the request's API version with the
``uid`` echoed. A response with no change carries no patch fields at all (never a ``null`` patch).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
# The API server shows at most this many bytes per warning; longer ones are cut there anyway.
WARNING_MAX = 256


class ReviewError(ValueError):
    """The body is not an AdmissionReview we can answer (HTTP 400)."""


@dataclass(frozen=True)
class GroupVersionKind:
    group: str
    version: str
    kind: str


@dataclass(frozen=True)
class AdmissionRequest:
    """The fields of ``request`` the handlers use; ``object`` is the raw decoded object."""

    api_version: str
    uid: str
    kind: GroupVersionKind
    resource: str
    sub_resource: str
    operation: str
    namespace: str
    name: str
    object: Any
    dry_run: bool
    # The object before an UPDATE (None for CREATE).
    old_object: Any = None


@dataclass
class AdmissionResponse:
    """What a handler decides: allowed or not, an optional JSON patch, warnings, a denial message."""

    allowed: bool
    patch: list[dict[str, Any]] | None = None
    warnings: list[str] = field(default_factory=list)
    message: str = ""
    code: int = 403
    # Why, in one word, for metrics and logs (allowed, patched, denied, no-job, ignored, ...).
    result: str = "allowed"

    @classmethod
    def allow(cls, result: str = "allowed", warnings: list[str] | None = None) -> AdmissionResponse:
        return cls(allowed=True, warnings=warnings or [], result=result)

    @classmethod
    def deny(cls, message: str, code: int = 403, result: str = "denied") -> AdmissionResponse:
        return cls(allowed=False, message=message, code=code, result=result)

    @classmethod
    def errored(cls, message: str, code: int = 500, result: str = "error") -> AdmissionResponse:
        """Not decided: the API server treats it as a failed call (``failurePolicy``), and Volcano's
        controller retries the Pod's creation."""
        return cls(allowed=False, message=message, code=code, result=result)


def _str(value: Any, where: str, *, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise ReviewError(f"{where} must be a non-empty string" if required else f"{where} must be a string")
    return value


def parse_review(body: Any) -> AdmissionRequest:
    """Validate the envelope of a decoded AdmissionReview. Raises :class:`ReviewError` naming the field."""
    if not isinstance(body, Mapping):
        raise ReviewError("body must be a JSON object (an AdmissionReview)")
    api_version = body.get("apiVersion")
    if body.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind must be AdmissionReview, got {body.get('kind')!r}")
    if api_version not in API_VERSIONS:
        raise ReviewError(f"apiVersion must be one of {', '.join(API_VERSIONS)}, got {api_version!r}")
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise ReviewError("request is missing or not an object")
    kind = request.get("kind")
    if not isinstance(kind, Mapping):
        raise ReviewError("request.kind is missing or not an object")
    resource = request.get("resource")
    resource = resource if isinstance(resource, Mapping) else {}
    dry_run = request.get("dryRun")
    if dry_run is not None and not isinstance(dry_run, bool):
        raise ReviewError("request.dryRun must be a boolean")
    return AdmissionRequest(
        api_version=api_version,
        uid=_str(request.get("uid"), "request.uid", required=True),
        kind=GroupVersionKind(
            _str(kind.get("group"), "request.kind.group"),
            _str(kind.get("version"), "request.kind.version"),
            _str(kind.get("kind"), "request.kind.kind", required=True),
        ),
        resource=_str(resource.get("resource"), "request.resource.resource"),
        sub_resource=_str(request.get("subResource"), "request.subResource"),
        operation=_str(request.get("operation"), "request.operation", required=True),
        namespace=_str(request.get("namespace"), "request.namespace"),
        name=_str(request.get("name"), "request.name"),
        object=request.get("object"),
        dry_run=bool(dry_run),
        old_object=request.get("oldObject"),
    )


def review_response(request: AdmissionRequest, response: AdmissionResponse) -> dict[str, Any]:
    """The AdmissionReview to send back, in the request's API version."""
    out: dict[str, Any] = {"uid": request.uid, "allowed": response.allowed}
    if response.allowed and response.patch:
        out["patchType"] = "JSONPatch"
        out["patch"] = base64.b64encode(orjson.dumps(response.patch)).decode()
    if not response.allowed:
        out["status"] = {"status": "Failure", "code": response.code, "message": response.message}
    if response.warnings:
        out["warnings"] = [w if len(w) <= WARNING_MAX else w[: WARNING_MAX - 3] + "..." for w in response.warnings]
    return {"apiVersion": request.api_version, "kind": "AdmissionReview", "response": out}


def admission_review(obj: dict[str, Any], *, api_version: str = API_VERSIONS[0], uid: str, operation: str = "CREATE",
                     old: dict[str, Any] | None = None) -> dict[str, Any]:
    """The AdmissionReview the API server sends for ``obj`` (a Pod or a Volcano Job); ``old`` is
    the object before an UPDATE."""
    meta = obj.get("metadata") or {}
    api_group, _, version = str(obj.get("apiVersion") or "v1").rpartition("/")
    kind = str(obj.get("kind") or "Pod")
    resource = {"Pod": "pods", "Job": "jobs"}.get(kind, kind.lower() + "s")
    gvk = {"group": api_group, "version": version, "kind": kind}
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": {"group": api_group, "version": version, "resource": resource},
            "requestKind": gvk,
            "requestResource": {"group": api_group, "version": version, "resource": resource},
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", ""),
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:volcano-system:volcano-controllers"},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "UpdateOptions" if operation == "UPDATE" else "CreateOptions"},
        },
    }
